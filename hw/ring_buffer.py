"""Micro-slice ring buffer of one chiplet (virtualization Rules 1-4).

Golden model: :class:`fsedp.sw.streaming.StreamingArray` (slots, ``arrive``, offers,
compute pick, release).  Doc page: ``docs/blocks/datapath.md``.
"""

from amaranth import Array, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import check_chiplet, lowest_bit, ring_after, tree_sum
from fsedp.hw.layouts import (
    candidate_layout,
    delivery_layout,
    packet_layout,
    store_layout,
    unhold_layout,
)
from fsedp.params import DatapathParams

__all__ = [
    "RingBuffer",
    "LinkSignature",
    "ComputeSignature",
    "ReservationSignature",
    "DeliverySignature",
    "UnholdSignature",
    "RetireSignature",
    "arrive_fields",
    "shortest",
]


def LinkSignature(p: DatapathParams) -> wiring.Signature:
    """A die-to-die link (or a ring buffer's offer to its router): ``valid``/``payload``
    offer a micro-slice, ``ready`` accepts it.  Unlike ``lib.stream`` an offer that is not
    accepted may be withdrawn or replaced in the next cycle: the sender always offers its
    best candidate, which is what keeps forward-count admission deadlock-free."""
    return wiring.Signature({"payload": Out(packet_layout(p)), "valid": Out(1), "ready": In(1)})


def ReservationSignature(p: DatapathParams) -> wiring.Signature:
    """A slot reservation, from the DDR controller's side: ``valid`` reserves a ring-buffer
    slot for the load issued this cycle; the buffer answers with ``slot`` in the same cycle
    (combinational, from registered state: its highest free slot).  Under forward-state
    admission ([D16]) ``claim`` is the hops the reserved slot counts for: the load's ``r``,
    or ``H + 1`` for a held one."""
    members = {"valid": Out(1), "slot": In(p.slot_bits)}
    if p.admission == "forward-state":
        members["claim"] = Out(p.hop_bits)
    return wiring.Signature(members)


def DeliverySignature(p: DatapathParams) -> stream.Signature:
    """A DDR load arriving in the slot reserved at its issue (``delivery_layout``).  Always
    ready: the slot is the load's since the reservation."""
    return stream.Signature(delivery_layout(p), always_ready=True)


def UnholdSignature(p: DatapathParams) -> stream.Signature:
    """A pre-loaded expert was dispatched (``unhold_layout``): its held micro-slices may
    stream.  Always ready: a one-cycle notice."""
    return stream.Signature(unhold_layout(p), always_ready=True)


def RetireSignature(p: DatapathParams) -> stream.Signature:
    """A micro-slice of expert ``payload`` finished its last station (a chiplet's final
    compute) and retires.  Always ready: the DDR controller counts every one."""
    return stream.Signature(p.expert_bits, always_ready=True)


def ComputeSignature(p: DatapathParams) -> wiring.Signature:
    """Ring buffer -> compute unit, from the buffer's side.

    ``valid``/``payload`` (``candidate_layout``) offer the compute candidate and ``take``
    starts it; like a link, an offer not taken may be withdrawn or replaced in the next
    cycle (a link arrival goes before a local load, Rule 1; [D11] a shorter one).  ``done``
    (always ready) names the slot whose computation ends this cycle.  With ``p.preempt``:
    ``remaining`` (the running countdown), ``preempted`` (the running computation stops and
    hands its remainder back), the two arrival lookups ``look_expert`` -> ``look_cycles``
    (link, DDR) and ``write``, the token-table write of this cycle with its new duration."""
    members = {
        "valid": Out(1),
        "payload": Out(candidate_layout(p)),
        "take": In(1),
        "done": In(stream.Signature(p.slot_bits, always_ready=True)),
    }
    if p.preempt:
        write = data.StructLayout({"expert": p.expert_bits, "cycles": p.compute_bits})
        members |= {
            "remaining": In(p.compute_bits),
            "preempted": In(1),
            "look_expert": Out(p.expert_bits).array(2),
            "look_cycles": In(p.compute_bits).array(2),
            "write": In(stream.Signature(write, always_ready=True)),
        }
    return wiring.Signature(members)


def arrive_fields(m: Module, p: DatapathParams, c: int, h, prefix: str) -> dict:
    """Slot fields of micro-slice ``h`` (a ``packet_layout`` view) stored at chiplet ``c``:
    combinational, mirrors :func:`fsedp.sw.streaming.arrive`."""
    station = Signal(name=f"{prefix}_station")
    more = Signal(name=f"{prefix}_more")
    nxt = Signal(p.chiplet_bits, name=f"{prefix}_next")
    dest = Signal(p.chiplet_bits, name=f"{prefix}_dest")
    dirs = Array(Const(p.direction(c, d) if d != c else 0, 2) for d in range(p.chiplets))
    m.d.comb += [
        station.eq(h.dest == c),
        more.eq(h.legs != 0),
        nxt.eq(ring_after(h.traj, c, p.chiplets, p.chiplet_bits, p.ring_table(0)[0])),
        dest.eq(Mux(station, Mux(more, nxt, c), h.dest)),
    ]
    return {
        "comp": station,
        "send": ~station | more,
        "final": station & ~more,
        "dest": dest,
        "legs": Mux(station & more, h.legs - 1, h.legs),
        "dir": dirs[dest],
        "r": h.r,
    }


def shortest(m: Module, prefix: str, cands: list, keys, key_width: int, index_width: int):
    """``(valid, key, index)`` of the candidate with the smallest key, ties to the lower
    index: a balanced tree of ``len(cands) - 1`` compare-and-select nodes, ``ceil(log2 K)``
    deep, each a named signal (the router offers' fewest hops, [D11]'s shortest
    computation).  A node takes its upper half's pick only when it is strictly smaller, so
    the lower index wins every tie, as in a scan from slot 0; with no candidate, key and
    index are 0.  (A scan was ``K`` stages deep: the ring buffer's critical path.)"""

    def node(lo: int, hi: int):
        if hi - lo == 1:  # a leaf: key and index 0 unless it is a candidate (as the scan's)
            v = Signal(name=f"{prefix}_cand{lo}")
            k, i = (
                Signal(key_width, name=f"{prefix}_k{lo}"),
                Signal(index_width, name=f"{prefix}_i{lo}"),
            )
            m.d.comb += [v.eq(cands[lo]), k.eq(Mux(v, keys[lo], 0)), i.eq(Mux(v, lo, 0))]
            return v, k, i
        mid = (lo + hi + 1) // 2
        (av, ak, ai), (bv, bk, bi) = node(lo, mid), node(mid, hi)
        take = Signal(name=f"{prefix}_take{lo}_{hi}")
        nv, nk = Signal(name=f"{prefix}_v{lo}_{hi}"), Signal(key_width, name=f"{prefix}_k{lo}_{hi}")
        ni = Signal(index_width, name=f"{prefix}_i{lo}_{hi}")
        m.d.comb += [
            take.eq(bv & (~av | (bk < ak))),
            nv.eq(av | bv),
            nk.eq(Mux(take, bk, ak)),
            ni.eq(Mux(take, bi, ai)),
        ]
        return nv, nk, ni

    if not cands:
        return Const(0), Const(0, key_width), Const(0, index_width)
    return node(0, len(cands))


class RingBuffer(wiring.Component):
    """``K`` micro-slice slots of one chiplet with their state machine.

    Parameters
    ----------
    p : DatapathParams
    chiplet : int
        This chiplet's number (fixes its XY directions).

    Members
    -------
    rx : In(stream.Signature(packet_layout))
        A micro-slice granted by the router (already admitted: ``free - resv > r``); stored into
        the lowest free slot, usable ``link_cycles`` cycles later.  ``ready`` is ``free != 0``.
    free : Out
        Free slots (``K`` minus allocated and reserved), from registered state.
    resv : In(ReservationSignature)
        The DDR controller reserves slot ``resv.slot`` (the highest free one) this cycle.
    ddr : In(DeliverySignature), always ready
        A DDR load delivered into its reserved slot (usable the next cycle).
    offer : Out(LinkSignature) x 4
        Per direction N/E/S/W: the slot ready to forward that way with the fewest hops left
        (ties to the lower slot); ``ready`` means the transfer starts this cycle (the slot's
        payload is then read for ``link_cycles`` cycles).
    compute : Out(ComputeSignature)
        Compute candidate (``valid``, ``payload``): a pending micro-slice received over a
        link (Rule 1) before a local one (Rule 2), lower slot first; ``take`` starts it;
        ``done`` names the slot whose computation ends this cycle.  With ``p.preempt``
        ([D11]) every slot keeps its duration (``max(1, tokens) * cycles_per_token``, or what
        is left of a preempted computation, ``payload.cycles``).  While the compute unit has
        more than one cycle left (``remaining > 1``) the candidate is the shortest present
        one (ties to the lower slot), valid only when shorter than ``remaining - 1``; on
        ``preempted`` the slot being computed takes back its remainder and waits again.
        ``look_expert``/``look_cycles``: durations of the micro-slices arriving this cycle
        (link, DDR) from the token table; ``write``: a token-table write, slots of that
        expert take the new duration.
    unhold : In(UnholdSignature), always ready
        The pre-loaded micro-slices of ``unhold.payload.expert`` held here may now stream.
    occupancy : Out
        Allocated slots (``K - free``).
    admit, admit_spare : Out(H + 2); only with ``admission = "forward-state"``
        [D16], from registered state: bit ``r`` of ``admit`` says a micro-slice with ``r``
        hops to go may enter (for every ``i <= r``, ``N(>= i) + 1 + i <= K``, ``N(>= i)``
        the slots whose claim is at least ``i``), of ``admit_spare`` that it may enter with
        one slot more taken (``N(>= i) + 2 + i <= K``).  After admitting one that claims
        ``a``, one with ``r`` hops may still enter iff ``admit[r]`` and
        ``admit_spare[min(r, a)]`` (the DDR controller's load, then the router's accept:
        [D19]).
    admit_load : Out(H + 2); only with ``admission = "forward-state"``
        [D20], for the DDR controller: bit ``r`` says a DDR load claiming ``r`` may enter
        (``admit[r]`` and ``admit_spare[min(r, H - 1)]``: with the load taken, an arrival
        with ``min(r, H - 1)`` hops to go would still be admitted).
        A slot's claim is written at its reservation (``resv.claim``) and its store (the
        micro-slice's ``r``, ``H + 1`` while held) and lowered to ``r`` when un-held.

    Latency: a slot is released one cycle after its last use (Rule 3).  Throughput: one
    link arrival and one DDR delivery per cycle, one transfer start per direction per cycle.
    """

    def __init__(self, p: DatapathParams, chiplet: int):
        check_chiplet(self, p, chiplet)
        self.p, self.chiplet = p, chiplet
        link = LinkSignature(p)
        state = p.admission == "forward-state"
        super().__init__(
            {
                "rx": In(stream.Signature(packet_layout(p))),
                "free": Out(p.free_bits),
                "resv": In(ReservationSignature(p)),
                "ddr": In(DeliverySignature(p)),
                "offer": Out(link).array(4),
                "compute": Out(ComputeSignature(p)),
                "unhold": In(UnholdSignature(p)),
                "occupancy": Out(p.free_bits),
                **(
                    {
                        "admit": Out(p.held_claim + 1),
                        "admit_spare": Out(p.held_claim + 1),
                        "admit_load": Out(p.held_claim + 1),
                    }
                    if state
                    else {}
                ),
            }
        )

    def elaborate(self, platform):
        p, c = self.p, self.chiplet
        K, L = p.slots, p.link_cycles
        m = Module()
        cnt_bits = max(1, (L - 1).bit_length())

        m.submodules.store = store = memory.Memory(shape=store_layout(p), depth=K, init=[])
        w_rx = store.write_port()
        w_ddr = store.write_port()
        r_tx = [store.read_port(domain="comb") for _ in range(4)]
        r_cmp = store.read_port(domain="comb")

        def slot_signal(name, width=1):
            return Array(Signal(width, name=f"{name}{i}") for i in range(K))

        busy, resv, held = slot_signal("busy"), slot_signal("resv"), slot_signal("held")
        comp, computing, send = slot_signal("comp"), slot_signal("computing"), slot_signal("send")
        ddr, final = slot_signal("ddr"), slot_signal("final")
        wait, tx = slot_signal("wait", cnt_bits), slot_signal("tx", cnt_bits)
        # ``wait == 0`` and ``tx == 0`` kept as registers, set with the counters they mirror
        # (retimed: the counters' zero-detect is off the offer and compute paths; cycle for
        # cycle the same values)
        wz = Array(Signal(name=f"wait_zero{i}", init=1) for i in range(K))
        tz = Array(Signal(name=f"tx_zero{i}", init=1) for i in range(K))
        dirr, hops = slot_signal("dir", 2), slot_signal("hops", p.hop_bits)
        expert = slot_signal("expert", p.expert_bits)

        present = [Signal(name=f"present{i}") for i in range(K)]
        releasable = [Signal(name=f"releasable{i}") for i in range(K)]
        for i in range(K):
            m.d.comb += [
                present[i].eq(busy[i] & ~resv[i] & wz[i] & ~held[i]),
                releasable[i].eq(present[i] & ~comp[i] & ~computing[i] & ~send[i] & tz[i]),
            ]

        # -- free slots -----------------------------------------------------------------
        # a register kept with the slots (retimed: the count of busy slots, a tree of adders,
        # is off the DDR controller's and the routers' admission paths; cycle for cycle the
        # same value, K minus the busy slots): each cycle it gains the slots released (Rule 3,
        # counted on the registered state) and loses the link arrival and the reservation
        free_r = Signal(p.free_bits, init=K)
        free_vec = Signal(K)
        m.d.comb += [free_vec[i].eq(~busy[i]) for i in range(K)]
        m.d.comb += [self.free.eq(free_r), self.occupancy.eq(K - free_r)]
        rx_slot = Signal(p.slot_bits)
        m.d.comb += rx_slot.eq(lowest_bit(free_vec, K, p.slot_bits))
        high_expr = Const(0, p.slot_bits)
        for i in range(K):
            high_expr = Mux(free_vec[i], i, high_expr)
        high = Signal(p.slot_bits)
        m.d.comb += [high.eq(high_expr), self.resv.slot.eq(high), self.rx.ready.eq(free_vec.any())]

        # -- forward-state admission [D16]: the claims' prefix conditions -------------------
        state = p.admission == "forward-state"
        if state:
            claim = slot_signal("claim", p.hop_bits)
            top = p.held_claim
            ok0 = Const(1)
            ok1 = Const(1)
            for i in range(top + 1):
                at_least = Signal(p.free_bits, name=f"claims_ge{i}")
                m.d.comb += at_least.eq(tree_sum(busy[s] & (claim[s] >= i) for s in range(K)))
                n0, n1 = Signal(name=f"admit{i}"), Signal(name=f"admit_spare{i}")
                m.d.comb += [
                    n0.eq(ok0 & (at_least + 1 + i <= K)),
                    n1.eq(ok1 & (at_least + 2 + i <= K)),
                    self.admit[i].eq(n0),
                    self.admit_spare[i].eq(n1),
                ]
                ok0, ok1 = n0, n1
            # [D20] a DDR load claiming r also leaves an arrival claiming min(r, H - 1) room
            m.d.comb += [
                self.admit_load[r].eq(self.admit[r] & self.admit_spare[min(r, top - 2)])
                for r in range(top + 1)
            ]

        # -- offers: fewest hops left, ties to the lower slot ----------------------------
        # keyed by the hops left after the transfer (a slot that forwards has at least one
        # hop to go, so the order is the hops'): the tree's key is the offer's ``r``, no
        # read of the chosen slot's hops and no decrement after the pick
        after_hop = [Signal(p.hop_bits, name=f"after_hop{i}") for i in range(K)]
        m.d.comb += [after_hop[i].eq(hops[i] - 1) for i in range(K)]
        tx_slot = []
        for d in range(4):
            best_v, best_r, best_i = shortest(
                m,
                f"tx{d}",
                [present[i] & send[i] & tz[i] & (dirr[i] == d) for i in range(K)],
                after_hop,
                p.hop_bits,
                p.slot_bits,
            )
            sel = Signal(p.slot_bits, name=f"tx_slot_{d}")
            m.d.comb += [sel.eq(best_i), r_tx[d].addr.eq(sel)]
            o = self.offer[d]
            m.d.comb += [
                o.valid.eq(best_v),
                o.payload.expert.eq(expert[sel]),
                o.payload.index.eq(r_tx[d].data.index),
                o.payload.traj.eq(r_tx[d].data.traj),
                o.payload.dest.eq(r_tx[d].data.dest),
                o.payload.legs.eq(r_tx[d].data.legs),
                o.payload.r.eq(best_r),
            ]
            tx_slot.append(sel)

        # -- compute candidate (Rule 1 before Rule 2) ------------------------------------
        link_c = Signal(K)
        local_c = Signal(K)
        for i in range(K):
            m.d.comb += [
                link_c[i].eq(present[i] & comp[i] & ~ddr[i]),
                local_c[i].eq(present[i] & comp[i] & ddr[i]),
            ]
        rule_slot = Signal(p.slot_bits)
        m.d.comb += rule_slot.eq(
            Mux(
                link_c.any(),
                lowest_bit(link_c, K, p.slot_bits),
                lowest_bit(local_c, K, p.slot_bits),
            )
        )
        cslot = Signal(p.slot_bits)
        if p.preempt:
            dur, pre = slot_signal("dur", p.compute_bits), slot_signal("pre")
            # [D11] the shortest present computation, ties to the lower slot
            best_v, best_d, best_i = shortest(
                m,
                "short",
                [link_c[i] | local_c[i] for i in range(K)],
                dur,
                p.compute_bits,
                p.slot_bits,
            )
            cu = self.compute
            running = cu.remaining > 1
            m.d.comb += [
                cslot.eq(Mux(running, best_i, rule_slot)),
                cu.valid.eq(
                    Mux(
                        running,
                        best_v & (best_d < cu.remaining - 1),
                        link_c.any() | local_c.any(),
                    )
                ),
                cu.payload.cycles.eq(dur[cslot]),
                cu.look_expert[0].eq(self.rx.payload.expert),
                cu.look_expert[1].eq(self.ddr.payload.packet.expert),
            ]
        else:
            m.d.comb += [cslot.eq(rule_slot), self.compute.valid.eq(link_c.any() | local_c.any())]
        m.d.comb += [
            self.compute.payload.slot.eq(cslot),
            r_cmp.addr.eq(cslot),
            self.compute.payload.expert.eq(expert[cslot]),
            self.compute.payload.index.eq(r_cmp.data.index),
            self.compute.payload.final.eq(final[cslot]),
        ]

        # -- next state (per slot, one-hot decoded events) ---------------------------------
        f_rx = arrive_fields(m, p, c, self.rx.payload, "rx")
        ddr_in = self.ddr.payload
        f_ddr = arrive_fields(m, p, c, ddr_in.packet, "ddr")
        rx_fire = self.rx.valid & self.rx.ready
        for port, slot, h, f, en in (
            (w_rx, rx_slot, self.rx.payload, f_rx, rx_fire),
            (w_ddr, ddr_in.slot, ddr_in.packet, f_ddr, self.ddr.valid),
        ):
            m.d.comb += [
                port.addr.eq(slot),
                port.en.eq(en),
                port.data.index.eq(h.index),
                port.data.traj.eq(h.traj),
                port.data.dest.eq(f["dest"]),
                port.data.legs.eq(f["legs"]),
            ]

        def store(i, h, f, wait_value, from_ddr, held_value, cycles):
            if p.preempt:
                m.d.sync += [dur[i].eq(cycles), pre[i].eq(0)]
            m.d.sync += [
                busy[i].eq(1),
                resv[i].eq(0),
                wait[i].eq(wait_value),
                wz[i].eq(wait_value == 0),
                held[i].eq(held_value),
                ddr[i].eq(from_ddr),
                computing[i].eq(0),
                tx[i].eq(0),
                tz[i].eq(1),
                comp[i].eq(f["comp"]),
                send[i].eq(f["send"]),
                final[i].eq(f["final"]),
                dirr[i].eq(f["dir"]),
                hops[i].eq(f["r"]),
                expert[i].eq(h.expert),
            ]
            if state:
                m.d.sync += claim[i].eq(Mux(held_value, top, f["r"]))

        cu = self.compute
        look = cu.look_cycles if p.preempt else (None, None)
        released = tree_sum(releasable[i] for i in range(K))
        m.d.sync += free_r.eq(free_r + released - rx_fire - self.resv.valid)
        for i in range(K):
            if p.preempt:
                wr = cu.write
                hit = wr.valid & busy[i] & ~pre[i] & (expert[i] == wr.payload.expert)
                with m.If(hit):
                    m.d.sync += dur[i].eq(wr.payload.cycles)
            with m.If(releasable[i]):
                m.d.sync += busy[i].eq(0)
            with m.If(~wz[i]):
                m.d.sync += [wait[i].eq(wait[i] - 1), wz[i].eq(wait[i] == 1)]
            with m.If(~tz[i]):
                m.d.sync += [tx[i].eq(tx[i] - 1), tz[i].eq(tx[i] == 1)]
            with m.If(self.unhold.valid & held[i] & (expert[i] == self.unhold.payload.expert)):
                m.d.sync += held[i].eq(0)
                if state:
                    m.d.sync += claim[i].eq(hops[i])
            for d in range(4):
                with m.If(self.offer[d].valid & self.offer[d].ready & (tx_slot[d] == i)):
                    m.d.sync += [send[i].eq(0), tx[i].eq(L - 1), tz[i].eq(L == 1)]
            with m.If(rx_fire & (rx_slot == i)):
                store(i, self.rx.payload, f_rx, L - 1, 0, 0, look[0])
            with m.If(self.ddr.valid & (ddr_in.slot == i)):
                store(i, ddr_in.packet, f_ddr, 0, 1, ddr_in.held, look[1])
            with m.If(self.resv.valid & (high == i)):
                m.d.sync += [busy[i].eq(1), resv[i].eq(1)]
                if state:
                    m.d.sync += claim[i].eq(self.resv.claim)
            with m.If(cu.done.valid & (cu.done.payload == i)):
                m.d.sync += computing[i].eq(0)
            if p.preempt:
                with m.If(cu.preempted & (cu.done.payload == i)):
                    # [D11] the computation being preempted waits again with its remainder
                    m.d.sync += [
                        computing[i].eq(0),
                        comp[i].eq(1),
                        pre[i].eq(1),
                        dur[i].eq(cu.remaining - 1),
                    ]
            with m.If(cu.take & (cslot == i)):
                m.d.sync += [comp[i].eq(0), computing[i].eq(1)]
                if p.preempt:
                    m.d.sync += pre[i].eq(0)
        return m
