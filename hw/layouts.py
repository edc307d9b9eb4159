"""Stream payload layouts of the scheduler, all derived from :class:`SchedulerParams`.

The testbenches pack and unpack beats with shifts taken from these same layouts' field
offsets (``gate_bits``, ``dispatch_decoder``; tested equal to ``layout.const`` and
``layout.from_bits``), so a field moves in one place only.
"""

from functools import cache

from amaranth.lib import data

from fsedp.params import BeatKind, SchedulerParams

__all__ = [
    "key_layout",
    "record_layout",
    "gate_layout",
    "req_init_layout",
    "entry_layout",
    "dispatch_from_bits",
    "dispatch_decoder",
    "gate_bits",
    "req_init_bits",
    "dispatch_layout",
]


def key_layout(p: SchedulerParams) -> data.StructLayout:
    """Sorter lane: token count and lane (expert) id, the sort key, and the expert's
    trajectory mask, which rides along."""
    return data.StructLayout({"count": p.count_width, "id": p.lane_id_bits, "traj": p.chiplets})


def record_layout(p: SchedulerParams) -> data.StructLayout:
    """One gate result as the EIT takes it."""
    return data.StructLayout(
        {"request": p.request_bits, "chiplet": p.chiplet_bits, "expert": p.expert_bits}
    )


def gate_layout(p: SchedulerParams) -> data.StructLayout:
    """Scheduler ``gate`` stream: a record plus ``last`` (final record of the round)."""
    return data.StructLayout(
        {"request": p.request_bits, "chiplet": p.chiplet_bits, "expert": p.expert_bits, "last": 1}
    )


def req_init_layout(p: SchedulerParams) -> data.StructLayout:
    return data.StructLayout({"request": p.request_bits, "t_qos": p.qos_width})


def entry_layout(p: SchedulerParams) -> data.StructLayout:
    """EIT entry of one (request, expert): trajectory mask and token count."""
    return data.StructLayout({"mask": p.chiplets, "count": p.count_width})


def dispatch_layout(p: SchedulerParams) -> data.StructLayout:
    """Scheduler ``dispatch`` stream (see :class:`fsedp.sw.scheduler.Dispatch`)."""
    return data.StructLayout(
        {
            "kind": BeatKind,
            "expert": p.expert_bits,
            "count": p.count_width,
            "traj": p.chiplets,
            "entry": p.chiplet_bits,
            "next_hop": data.ArrayLayout(p.chiplet_bits, p.chiplets),
        }
    )


def dispatch_from_bits(p: SchedulerParams, bits: int):
    """Decode a ``dispatch`` beat into the golden model's :class:`Dispatch`."""
    return dispatch_decoder(p)(bits)


@cache
def dispatch_decoder(p: SchedulerParams):
    """The decoder of ``dispatch`` beats for ``p``: shifts and masks from the layout's field
    offsets (fast enough for regressions of 10^5 rounds); ``tests/test_rtl_amaranth.py``
    shows it equal to Amaranth's view of the layout."""
    from fsedp.sw.scheduler import Dispatch

    (ko, km), (eo, em), (co, cm), (to, tm), (no, nm), (ho, _) = _fields(dispatch_layout, p)
    hop_mask = (1 << p.chiplet_bits) - 1
    hops = [ho + c * p.chiplet_bits for c in range(p.chiplets)]
    kinds = {k.value: k for k in BeatKind}

    def decode(bits: int):
        return Dispatch(
            kinds[bits >> ko & km],
            bits >> eo & em,
            bits >> co & cm,
            bits >> to & tm,
            bits >> no & nm,
            tuple(bits >> o & hop_mask for o in hops),
        )

    return decode


@cache
def _fields(layout_fn, p) -> tuple[tuple[int, int], ...]:
    """(offset, mask) of each field of ``layout_fn(p)``, in declaration order."""
    return tuple((f.offset, (1 << f.width) - 1) for _, f in layout_fn(p))


def _pack(fields, values) -> int:
    bits = 0
    for (off, mask), v in zip(fields, values):
        bits |= (int(v) & mask) << off
    return bits


def gate_bits(p: SchedulerParams, request: int, chiplet: int, expert: int, last: bool) -> int:
    """Payload of one ``gate`` beat (the same as ``gate_layout(p).const(...).as_bits()``;
    shifts from the layout's offsets, for stimulus of 10^5 rounds)."""
    return _pack(_fields(gate_layout, p), (request, chiplet, expert, last))


def req_init_bits(p: SchedulerParams, request: int, t_qos: int) -> int:
    """Payload of one ``req_init`` beat."""
    return _pack(_fields(req_init_layout, p), (request, t_qos))


# -- chiplet datapath (fsedp.params.DatapathParams) ------------------------------------
def packet_layout(p) -> data.StructLayout:
    """A micro-slice header on a link, on the DDR delivery port and at a ring buffer's input
    (see :class:`fsedp.sw.streaming.Header`)."""
    return data.StructLayout(
        {
            "expert": p.expert_bits,
            "index": p.index_bits,
            "traj": p.chiplets,
            "dest": p.chiplet_bits,
            "legs": p.chiplet_bits,
            "r": p.hop_bits,
        }
    )


def store_layout(p) -> data.StructLayout:
    """What a ring-buffer slot keeps in its storage (``lib.memory``): the next leg."""
    return data.StructLayout(
        {"index": p.index_bits, "traj": p.chiplets, "dest": p.chiplet_bits, "legs": p.chiplet_bits}
    )


def delivery_layout(p) -> data.StructLayout:
    """A DDR load: target chiplet and reserved slot, the micro-slice, pre-load ``held``."""
    return data.StructLayout(
        {"target": p.chiplet_bits, "slot": p.slot_bits, "packet": packet_layout(p), "held": 1}
    )


def tokens_layout(p) -> data.StructLayout:
    """Token-table write: ``count`` tokens of ``expert`` are held on ``chiplet``."""
    return data.StructLayout(
        {"chiplet": p.chiplet_bits, "expert": p.expert_bits, "count": p.count_width}
    )


def slices_layout(p) -> data.StructLayout:
    """Slice-table write ([D13]): ``expert`` streams ``count`` micro-slices (1 ..
    ``micro_slices``) from now on."""
    return data.StructLayout({"expert": p.expert_bits, "count": p.slice_count_bits})


def candidate_layout(p) -> data.StructLayout:
    """The ring buffer's compute candidate: its slot and micro-slice, whether it is the last
    station of its trajectory, and (``p.preempt`` only, [D11]) its duration in cycles."""
    fields = {"slot": p.slot_bits, "expert": p.expert_bits, "index": p.index_bits, "final": 1}
    if p.preempt:
        fields["cycles"] = p.compute_bits
    return data.StructLayout(fields)


def unhold_layout(p) -> data.StructLayout:
    """An un-hold ([D9] pre-loads): the held micro-slices of ``expert`` may stream; on
    ``chiplet`` with one DDR channel (0, every chiplet, with a channel per chiplet)."""
    return data.StructLayout({"chiplet": p.chiplet_bits, "expert": p.expert_bits})


def events_layout(p) -> data.ArrayLayout:
    """The array's ``events`` port: one :func:`event_layout` per chiplet."""
    return data.ArrayLayout(event_layout(p), p.chiplets)


def event_layout(p) -> data.StructLayout:
    """A chiplet's compute-completion event (observation port)."""
    return data.StructLayout(
        {"valid": 1, "expert": p.expert_bits, "index": p.index_bits, "final": 1}
    )


def dispatch_bits(p, b) -> int:
    """Encode a :class:`fsedp.sw.scheduler.Dispatch` as a ``dispatch`` beat.  The beat has
    no ring-embedding field yet: a beat of another embedding than the ring path's first
    (``ring_orders`` 2, 4 or 8, golden models and simulator only) is refused, not sent as
    the first one."""
    if getattr(b, "order", 0):
        raise ValueError(
            f"a dispatch beat of expert {b.expert} in ring order {b.order}: the RTL has the "
            "ring path's first embedding only (ring_orders 1)"
        )
    return (
        dispatch_layout(p)
        .const(
            {
                "kind": b.kind,
                "expert": b.expert,
                "count": min(b.count, 2**p.count_width - 1),
                "traj": b.traj,
                "entry": b.entry,
                "next_hop": list(b.next_hop),
            }
        )
        .as_bits()
    )


def tokens_bits(p, chiplet: int, expert: int, count: int) -> int:
    return tokens_layout(p).const({"chiplet": chiplet, "expert": expert, "count": count}).as_bits()


def slices_bits(p, expert: int, count: int) -> int:
    return slices_layout(p).const({"expert": expert, "count": count}).as_bits()


def unpack_events(p, bits) -> list:
    """The array's ``events`` port (its bits, or the :class:`data.Const` of
    :func:`events_layout` that Amaranth's simulator returns) as the golden model's
    ``StepOut.events``.  Shifts from the layout, for regressions of 10^5 cycles."""
    bits = bits.as_bits() if isinstance(bits, data.Const) else bits
    w = event_layout(p).size
    out = []
    for c in range(p.chiplets):
        v = event_layout(p).from_bits((bits >> (w * c)) & ((1 << w) - 1))
        out.append((int(v.expert), int(v.index), bool(v.final)) if v.valid else None)
    return out


def unpack_occupancy(p, bits) -> list[int]:
    """The array's ``occupancy`` port (bits or :class:`data.Const`) as a list per chiplet."""
    bits = bits.as_bits() if isinstance(bits, data.Const) else bits
    w = p.free_bits
    return [(bits >> (w * c)) & ((1 << w) - 1) for c in range(p.chiplets)]
