from amaranth import Cat, Const, Module, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.eit import EIT
from fsedp.hw.icv import ICV
from fsedp.hw.layouts import dispatch_layout, gate_layout, key_layout, req_init_layout
from fsedp.hw.matcher import ECMatcher
from fsedp.hw.pairing import PairingUnit
from fsedp.hw.sorter import BitonicSorter
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.params import BeatKind, SchedulerParams

__all__ = ["Scheduler"]


class Scheduler(wiring.Component):
    """FSE-DP expert-trajectory scheduler: EIT, token buffering, bitonic sorter, paired-load
    order, ICV and E-C matcher running Algorithm 1 round after round.

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

    Latency (cycles, counted from the cycle after the accepting clock edge to the first cycle
    with ``dispatch.valid``): after reset ``E + 1`` cycles clear the EIT; ``last`` gate record
    -> first dispatch is ``2E + S + 6`` with ``S = log2(N)(log2(N)+1)/2`` sorter stages
    (``n + 1`` more with ``balance``, which builds the balanced order one position per cycle);
    completion -> next dispatch is at most ``2K + 2`` for ``K`` list positions scanned (one
    cycle per scheduled position skipped, two per position checked); the scan stops as soon
    as the ICV is empty.  Dispatch throughput:
    back-to-back dispatch beats are at least 3 cycles apart, a pre-load beat follows its
    dispatch 2 cycles later (``docs/blocks/scheduler.md``).
    """

    def __init__(self, p: SchedulerParams):
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

    def elaborate(self, platform):
        m = Module()
        p = self.p
        E, C, R, N = p.experts, p.chiplets, p.requests, p.sorter_lanes
        m.submodules.eit = eit = EIT(p)
        m.submodules.tbu = tbu = TokenBufferUnit(p)
        m.submodules.sorter = sorter = BitonicSorter(p)
        m.submodules.pairing = pairing = PairingUnit(p)
        m.submodules.icv = icv = ICV(p)
        m.submodules.matcher = matcher = ECMatcher(p)
        m.submodules.traj_mem = traj_mem = memory.Memory(shape=C, depth=E, init=[])
        traj_wp = traj_mem.write_port()
        traj_rp = traj_mem.read_port()

        addr = Signal(range(E + 1))  # scan issue counter
        data_addr = Signal(range(E + 1))  # expert of the scan result in flight
        present = Signal(R)
        cold_hit = Signal(R)
        counts = Signal(data.ArrayLayout(p.count_width, E))
        n = Signal(p.position_bits)
        k = Signal(p.position_bits)  # position in the paired-load order
        q = Signal(p.position_bits)  # partner position under pre-load check
        sched = Signal(E)
        pre = Signal(E)
        nsched = Signal(p.position_bits)
        spurious = Signal()
        out = Signal(dispatch_layout(p))
        out_valid = Signal()

        # -- fixed wiring ----------------------------------------------------------------
        vec = data.ArrayLayout(key_layout(p), N)
        sort_in = Signal(vec)
        for lane in range(N):
            m.d.comb += [
                sort_in[lane].id.eq(lane),
                sort_in[lane].count.eq(counts[lane] if lane < E else 0),
            ]
        m.d.comb += [
            sorter.i.payload.eq(sort_in),
            pairing.keys.eq(sorter.o.payload),
            pairing.n.eq(n),
            matcher.traj.eq(traj_rp.data),
            matcher.icv.eq(icv.value),
            icv.release.eq(matcher.release),
            eit.rec.payload.request.eq(self.gate.payload.request),
            eit.rec.payload.chiplet.eq(self.gate.payload.chiplet),
            eit.rec.payload.expert.eq(self.gate.payload.expert),
            tbu.init.payload.eq(self.req_init.payload),
            tbu.present.eq(present),
            tbu.cold_hit.eq(cold_hit),
            traj_rp.addr.eq(pairing.expert),
            traj_rp.en.eq(0),
            self.dispatch.payload.eq(out),
            self.dispatch.valid.eq(out_valid),
            self.deferred.eq(tbu.defer),
            self.n_active.eq(n),
            self.overflow.eq(eit.overflow),
            self.bad_record.eq(eit.bad_record),
            self.spurious_done.eq(spurious),
            pairing.position.eq(k),
        ]

        def scan(include, clear):
            with m.If(addr != E):
                m.d.comb += [
                    eit.scan_en.eq(1),
                    eit.scan_addr.eq(addr),
                    eit.scan_include.eq(include),
                    eit.scan_clear.eq(clear),
                ]
                m.d.sync += addr.eq(addr + 1)
            m.d.sync += data_addr.eq(addr)

        def load_beat(kind, entry):
            """Register a dispatch or pre-load beat of the expert under
            ``pairing.position`` whose trajectory is on the ``traj_mem`` read port."""
            m.d.sync += [
                out.kind.eq(kind),
                out.expert.eq(pairing.expert),
                out.count.eq(pairing.count),
                out.traj.eq(traj_rp.data),
                out.entry.eq(entry),
                out.next_hop.eq(matcher.next_hop),
                out_valid.eq(1),
            ]

        def advance():
            m.d.sync += k.eq(k + 1)
            m.next = "READ"

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
                    m.d.sync += [addr.eq(0), present.eq(0), cold_hit.eq(0)]
                    m.next = "PASS1"
                with m.Else():
                    m.next = "FILL"

        with m.FSM(init="CLEAR"):
            with m.State("CLEAR"):
                scan(0, 1)
                with m.If(addr == E):
                    m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                accept_gate(first=True)
            with m.State("FILL"):
                accept_gate(first=False)
            with m.State("PASS1"):
                scan(Const((1 << R) - 1, R), 0)
                with m.If(eit.scan_valid):
                    hot_or_empty = (eit.scan_count == 0) | (eit.scan_count >= p.theta_min)
                    m.d.sync += [
                        present.eq(present | eit.scan_present),
                        cold_hit.eq(cold_hit | (eit.scan_present & ~hot_or_empty.replicate(R))),
                    ]
                    with m.If(data_addr == E - 1):
                        m.next = "TB"
            with m.State("TB"):
                m.d.comb += tbu.decide.eq(1)
                m.d.sync += [addr.eq(0), n.eq(0)]
                m.next = "PASS2"
            with m.State("PASS2"):
                scan(~tbu.defer, 1)
                with m.If(eit.scan_valid):
                    m.d.comb += [
                        traj_wp.en.eq(1),
                        traj_wp.addr.eq(data_addr),
                        traj_wp.data.eq(eit.scan_mask),
                    ]
                    m.d.sync += [
                        counts.eq(Cat(counts.as_value()[p.count_width :], eit.scan_count)),
                        n.eq(n + (eit.scan_count != 0)),
                    ]
                    with m.If(data_addr == E - 1):
                        m.next = "SORT"
            with m.State("SORT"):
                m.d.comb += sorter.i.valid.eq(1)
                m.d.sync += [k.eq(0), sched.eq(0), pre.eq(0), nsched.eq(0)]
                m.next = "SORTING"
            with m.State("SORTING"):
                with m.If(sorter.o.valid):
                    if p.balance:  # build the balanced order first (n cycles)
                        m.d.comb += pairing.start.eq(1)
                        m.next = "ORDER"
                    else:
                        m.next = "READ"
            if p.balance:
                with m.State("ORDER"):
                    with m.If(pairing.built):
                        m.next = "READ"
            with m.State("READ"):
                # with no idle chiplet nothing can be eligible: stop scanning and take
                # completions (same decisions as a full scan, sooner)
                with m.If((k >= n) | ~icv.value.any()):
                    m.next = "WAIT"
                with m.Elif(sched.bit_select(k, 1)):
                    m.d.sync += k.eq(k + 1)
                with m.Else():
                    m.d.comb += traj_rp.en.eq(1)
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(matcher.eligible):
                    load_beat(BeatKind.DISPATCH, matcher.entry)
                    m.next = "EMIT_D"
                with m.Else():
                    advance()
            with m.State("EMIT_D"):
                partner = k ^ 1
                m.d.comb += pairing.position.eq(partner)
                with m.If(self.dispatch.ready):
                    alloc = (1 << matcher.entry)[:C] if p.entry_dispatch else traj_rp.data
                    m.d.comb += [matcher.commit.eq(1), icv.alloc.eq(alloc)]
                    m.d.sync += [
                        out_valid.eq(0),
                        sched.bit_select(k, 1).eq(1),
                        nsched.eq(nsched + 1),
                    ]
                    with m.If(
                        (partner < n) & ~sched.bit_select(partner, 1) & ~pre.bit_select(partner, 1)
                    ):
                        m.d.sync += q.eq(partner)
                        m.d.comb += traj_rp.en.eq(1)
                        m.next = "PCHECK"
                    with m.Else():
                        advance()
            with m.State("PCHECK"):
                m.d.comb += pairing.position.eq(q)
                with m.If(~matcher.eligible):
                    load_beat(BeatKind.PRELOAD, matcher.first)
                    m.next = "EMIT_P"
                with m.Else():
                    advance()
            with m.State("EMIT_P"):
                with m.If(self.dispatch.ready):
                    m.d.sync += [out_valid.eq(0), pre.bit_select(q, 1).eq(1)]
                    advance()
            with m.State("WAIT"):
                with m.If((nsched == n) & ~matcher.running.any()):
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += self.done.ready.eq(1)
                    with m.If(self.done.valid):
                        m.d.comb += matcher.done.eq(self.done.payload)
                        m.d.sync += [spurious.eq(spurious | matcher.spurious), k.eq(0)]
                        with m.If(nsched != n):
                            m.next = "READ"
            with m.State("DRAIN"):
                m.d.comb += sorter.o.ready.eq(1)
                m.next = "IDLE"
        return m
