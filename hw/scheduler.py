from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import first_set, mux_tree
from fsedp.hw.eit import EIT
from fsedp.hw.icv import ICV
from fsedp.hw.layouts import dispatch_layout, gate_layout, key_layout, req_init_layout
from fsedp.hw.matcher import ECMatcher
from fsedp.hw.pairing import PairingUnit
from fsedp.hw.sorter import Sorter
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.params import BeatKind, SchedulerParams
from fsedp.sw.sorter import network

__all__ = ["Scheduler"]


class Scheduler(wiring.Component):
    """FSE-DP expert-trajectory scheduler: EIT, token buffering, sorter, dispatch order,
    ICV and E-C matcher running Algorithm 1 round after round (second generation,
    ``docs/blocks/scheduler.md``).

    The golden model is :class:`fsedp.sw.scheduler.Scheduler`; the beat-for-beat contract is
    described in ``docs/blocks/scheduler.md``.

    Members
    -------
    gate : In(stream.Signature(gate_layout))
        Gate records of one round, ``last`` on the final one.  Ready in ``IDLE``/``FILL``.
    req_init : In(stream.Signature(req_init_layout))
        Admit a request into the request table.  Ready in ``IDLE``/``FILL``.
    dispatch : Out(stream.Signature(dispatch_layout))
        Dispatch and Rule 4 pre-load beats, in decision order.  Back-pressure stalls the
        scheduling loop.
    done : In(stream.Signature(C))
        Completion masks over running slots (entry chiplets).  Ready only while the
        scheduler waits (no decision possible).
    idle : Out(1)
        Between rounds: ready for gate records.
    deferred : Out(R)
        Requests deferred by token buffering in the current/last round.
    n_active : Out(position_bits)
        Experts to schedule in the current/last round.
    overflow, bad_record, spurious_done : Out(1)
        Sticky error flags of the current/last round.

    Latency (the triggering transfer in cycle 0): ``idle`` right after reset; the ``last``
    gate record of a round -> first ``dispatch.valid`` in cycle :attr:`latency` ``= L + 8``
    with ``L`` the sorter's latency (``Sorter.latency``), plus ``ceil(E / eit_lanes) + 1`` in
    a round where token buffering defers a request and ``n + 2`` with ``balance``
    (``ORDER0``, the balanced order built one position per cycle, ``ORDER`` seeing
    ``built``); completion -> next ``dispatch.valid`` in cycle 3.  (``tb/tb_scheduler.py``,
    ``fsedp run`` and ``fsedp rtl cosim`` count from the cycle after the transfer and report
    one less: ``L + 7`` and 2.)  Dispatch throughput: a dispatch beat every 3 cycles; a
    pre-load beat follows its dispatch 2 cycles later.
    """

    def __init__(self, p: SchedulerParams):
        if p.ring_orders != 1:
            self._MustUse__silence = True  # never elaborated: no unused-elaboratable warning
            raise ValueError(
                f"ring_orders {p.ring_orders}: the scheduler RTL chooses no ring embedding yet "
                "(ring_orders 1, either ring path); the golden model and the simulator take "
                "2, 4 and 8"
            )
        self.p = p
        super().__init__(
            {
                "gate": In(stream.Signature(gate_layout(p))),
                "req_init": In(stream.Signature(req_init_layout(p))),
                "dispatch": Out(stream.Signature(dispatch_layout(p))),
                "done": In(stream.Signature(p.chiplets)),
                "idle": Out(1),
                "deferred": Out(p.requests),
                "n_active": Out(p.position_bits),
                "overflow": Out(1),
                "bad_record": Out(1),
                "spurious_done": Out(1),
            }
        )

    @property
    def latency(self) -> int:
        """Cycle of the first ``dispatch.valid`` of a round whose ``last`` gate record is
        transferred in cycle 0, when token buffering defers nothing (``balance`` adds
        ``n + 2``): ``SETTLE`` (2), ``TB``, ``DEFER``, ``SORT``, the sorter's ``L``,
        ``PICK``, ``CHECK``, then ``EMIT_D``."""
        # Sorter.latency is its network's cycles (a Sorter built here would go unelaborated)
        return network(self.p.sorter_lanes, self.p.sorter).cycles + 8

    def elaborate(self, platform):
        m = Module()
        p = self.p
        E, N = p.experts, p.sorter_lanes
        m.submodules.eit = eit = EIT(p)
        m.submodules.tbu = tbu = TokenBufferUnit(p)
        m.submodules.sorter = sorter = Sorter(p)
        m.submodules.pairing = pairing = PairingUnit(p)
        m.submodules.icv = icv = ICV(p)
        m.submodules.matcher = matcher = ECMatcher(p)

        addr = Signal(range(eit.words + 2))  # merge word counter
        settle = Signal(2)
        n = Signal(p.position_bits)
        sel = Signal(p.lane_id_bits)  # sorted index of the expert being dispatched
        q = Signal(p.lane_id_bits)  # its partner, under pre-load check
        sched = Signal(N)  # per sorted index: dispatched
        pre = Signal(N)  # per sorted index: pre-loaded
        nsched = Signal(p.position_bits)
        spurious = Signal()
        out = Signal(dispatch_layout(p))
        out_valid = Signal()
        look = Signal(p.lane_id_bits)  # the sorted lane on the matcher

        # -- fixed wiring ----------------------------------------------------------------
        vec = data.ArrayLayout(key_layout(p), N)
        sort_in = Signal(vec)
        for lane in range(N):
            m.d.comb += sort_in[lane].id.eq(lane)
            if lane < E:
                m.d.comb += [
                    sort_in[lane].count.eq(eit.count[lane]),
                    sort_in[lane].traj.eq(eit.mask[lane]),
                ]
        keys = sorter.o.payload
        lane = Signal(key_layout(p))  # the sorted lane on the matcher
        m.d.comb += lane.eq(mux_tree([keys[i].as_value() for i in range(N)], look))
        partner_busy = Signal()  # the partner is dispatched or pre-loaded
        m.d.comb += partner_busy.eq(
            mux_tree([sched[i] | pre[i] for i in range(N)], pairing.partner)
        )
        m.d.comb += [
            sorter.i.payload.eq(sort_in),
            pairing.keys.eq(keys),
            pairing.n.eq(n),
            pairing.index.eq(sel),
            matcher.traj.eq(lane.traj),
            matcher.icv.eq(icv.value),
            icv.release.eq(matcher.release),
            eit.rec.payload.request.eq(self.gate.payload.request),
            eit.rec.payload.chiplet.eq(self.gate.payload.chiplet),
            eit.rec.payload.expert.eq(self.gate.payload.expert),
            eit.merge_addr.eq(addr),
            eit.merge_include.eq(~tbu.defer),
            tbu.init.payload.eq(self.req_init.payload),
            tbu.present.eq(eit.present),
            tbu.cold_hit.eq(eit.cold_hit),
            self.dispatch.payload.eq(out),
            self.dispatch.valid.eq(out_valid),
            self.deferred.eq(tbu.defer),
            self.n_active.eq(n),
            self.overflow.eq(eit.overflow),
            self.bad_record.eq(eit.bad_record),
            self.spurious_done.eq(spurious),
            look.eq(sel),
        ]

        # -- eligibility: per sorted index, not dispatched and its trajectory has an idle
        # chiplet; the first in the order is the lowest eligible index below the split or
        # the highest at or above it, whichever has the lower position
        eligible = [
            (keys[i].count != 0) & ~sched[i] & (keys[i].traj & icv.value).any() for i in range(N)
        ]
        below = [i < pairing.split for i in range(N)]
        any_hot, hot = first_set([e & b for e, b in zip(eligible, below)])
        any_cold, cold = first_set([e & ~b for e, b in zip(eligible, below)], highest=True)
        take_cold = any_cold & (~any_hot | (pairing.cold_position < pairing.hot_position))
        m.d.comb += [pairing.hot_index.eq(hot), pairing.cold_index.eq(cold)]

        # thermometer of non-zero counts in the sorted vector -> n
        any_zero, first_zero = first_set([keys[i].count == 0 for i in range(N)])

        def load_beat(kind, entry):
            """Register a beat of the sorted lane on the matcher (``look``)."""
            m.d.sync += [
                out.kind.eq(kind),
                out.expert.eq(lane.id),
                out.count.eq(lane.count),
                out.traj.eq(lane.traj),
                out.entry.eq(entry),
                out.next_hop.eq(matcher.next_hop),
                out_valid.eq(1),
            ]

        def accept_gate(first):
            m.d.comb += [
                self.gate.ready.eq(1),
                eit.rec.valid.eq(self.gate.valid),
                self.req_init.ready.eq(1),
                tbu.init.valid.eq(self.req_init.valid),
            ]
            with m.If(self.gate.valid):
                if first:  # a new round: clear the sticky flags
                    m.d.comb += eit.flags_clear.eq(1)
                    m.d.sync += spurious.eq(0)
                with m.If(self.gate.payload.last):
                    m.d.sync += settle.eq(0)
                    m.next = "SETTLE"
                with m.Else():
                    m.next = "FILL"

        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                accept_gate(first=True)
            with m.State("FILL"):
                accept_gate(first=False)
            with m.State("SETTLE"):
                # the last record reaches the merged registers, then cold_hit
                m.d.sync += settle.eq(settle + 1)
                with m.If(settle == 1):
                    m.next = "TB"
            with m.State("TB"):
                m.d.comb += tbu.decide.eq(1)
                m.d.sync += addr.eq(0)
                m.next = "DEFER"
            with m.State("DEFER"):
                # token buffering deferred some requests: merge again without them
                with m.If(~tbu.defer.any() | (addr == eit.words + 1)):
                    m.next = "SORT"
                with m.Else():
                    m.d.comb += eit.merge_en.eq(addr < eit.words)
                    m.d.sync += addr.eq(addr + 1)
            with m.State("SORT"):
                m.d.comb += [sorter.i.valid.eq(1), eit.clear.eq(1)]
                m.d.sync += [sched.eq(0), pre.eq(0), nsched.eq(0)]
                m.next = "SORTING"
            with m.State("SORTING"):
                with m.If(sorter.o.valid):
                    m.d.sync += n.eq(Cat(first_zero, ~any_zero) if N == E else first_zero)
                    if p.balance:  # build the balanced order first (n cycles)
                        m.next = "ORDER0"
                    else:
                        m.next = "PICK"
            if p.balance:
                with m.State("ORDER0"):
                    m.d.comb += pairing.start.eq(1)
                    m.next = "ORDER"
                with m.State("ORDER"):
                    with m.If(pairing.built):
                        m.next = "PICK"
            with m.State("PICK"):
                with m.If(any_hot | any_cold):
                    m.d.sync += sel.eq(Cat(hot, 0)[: p.lane_id_bits])
                    with m.If(take_cold):
                        m.d.sync += sel.eq(cold)
                    m.next = "CHECK"
                with m.Else():
                    # nothing eligible: take completions
                    m.next = "WAIT"
            with m.State("CHECK"):
                load_beat(BeatKind.DISPATCH, matcher.entry)
                m.next = "EMIT_D"
            with m.State("EMIT_D"):
                with m.If(self.dispatch.ready):
                    alloc = (1 << matcher.entry)[: p.chiplets] if p.entry_dispatch else lane.traj
                    m.d.comb += [matcher.commit.eq(1), icv.alloc.eq(alloc)]
                    m.d.sync += [
                        out_valid.eq(0),
                        sched.bit_select(sel, 1).eq(1),
                        nsched.eq(nsched + 1),
                        q.eq(pairing.partner),
                    ]
                    with m.If(pairing.partner_valid & ~partner_busy):
                        m.next = "PCHECK"
                    with m.Else():
                        m.next = "PICK"
            with m.State("PCHECK"):
                m.d.comb += look.eq(q)
                with m.If(~matcher.eligible):
                    load_beat(BeatKind.PRELOAD, matcher.first)
                    m.next = "EMIT_P"
                with m.Else():
                    m.next = "PICK"
            with m.State("EMIT_P"):
                with m.If(self.dispatch.ready):
                    m.d.sync += [out_valid.eq(0), pre.bit_select(q, 1).eq(1)]
                    m.next = "PICK"
            with m.State("WAIT"):
                with m.If((nsched == n) & ~matcher.running.any()):
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += self.done.ready.eq(1)
                    with m.If(self.done.valid):
                        m.d.comb += matcher.done.eq(self.done.payload)
                        m.d.sync += spurious.eq(spurious | matcher.spurious)
                        with m.If(nsched != n):
                            m.next = "PICK"
            with m.State("DRAIN"):
                m.d.comb += sorter.o.ready.eq(1)
                m.next = "IDLE"
        #: state names by their encoding in ``fsm_state`` (coverage of resets, waveforms)
        self.fsm_states = tuple(sorted(fsm.encoding, key=fsm.encoding.get))
        return m
