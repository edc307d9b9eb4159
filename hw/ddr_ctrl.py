"""DDR controller of the chiplet array: expert jobs from the scheduler's dispatch stream,
micro-slice loads (Rules 4 and 5, Rule 4 pre-loads), delivery after the DDR latency,
retirement and the ``done`` stream back to the scheduler.

Golden model: steps 3, 4 and 6 of :meth:`fsedp.sw.streaming.StreamingArray.step`.  Doc page:
``docs/blocks/datapath.md``.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import check_chiplet, lowest_bit, ring_next_hops, rr_pick
from fsedp.hw.layouts import delivery_layout, dispatch_layout, tokens_layout
from fsedp.params import BeatKind, DatapathParams, bits_for

__all__ = ["DDRController", "path_hops"]


def path_hops(m: Module, p: DatapathParams, traj, name: str) -> list:
    """Per chiplet ``a``: XY hops of a micro-slice of ``traj`` loaded on ``a`` (all ring
    legs but the one into ``a``); mirrors :meth:`DatapathParams.path_hops`."""
    n = p.chiplets
    nh = []
    for a, hop in enumerate(ring_next_hops(traj, n, p.chiplet_bits)):
        s = Signal(p.chiplet_bits, name=f"{name}_next{a}")
        m.d.comb += s.eq(hop)
        nh.append(s)
    dist = [Array(Const(p.distance(a, b), p.hop_bits) for b in range(n)) for a in range(n)]
    legs = [Signal(p.hop_bits, name=f"{name}_leg{a}") for a in range(n)]
    for a in range(n):
        m.d.comb += legs[a].eq(Mux(traj[a], dist[a][nh[a]], 0))
    ring = Signal(p.hop_bits + bits_for(n + 1), name=f"{name}_ring")
    m.d.comb += ring.eq(sum(legs))
    out = []
    for a in range(n):
        into = Const(0, p.hop_bits)
        for b in range(n):
            into = Mux(traj[b] & (nh[b] == a), p.distance(b, a), into)
        h = Signal(p.hop_bits, name=f"{name}_hops{a}")
        m.d.comb += h.eq(ring - into)
        out.append(h)
    return out


class DDRController(wiring.Component):
    """Jobs, loads and completions of the chiplet array.

    Members
    -------
    dispatch : In(stream.Signature(dispatch_layout)), always ready
        DISPATCH opens the job of entry slot ``entry``; PRELOAD opens a pre-load entry
        (dropped when all ``preload_entries`` are in use).  A beat with an empty trajectory,
        an entry outside it, an out-of-range expert, or a DISPATCH to a busy entry slot is
        ignored and sets the sticky ``bad_dispatch``.
    free, accept : In x chiplets
        Each ring buffer's free slots and whether it accepts a link arrival this cycle.
    resv_valid : Out x chiplets, resv_slot : In x chiplets
        Slot reservation of the load issued this cycle.
    deliver_valid : Out(1), deliver : Out(delivery_layout)
        A load arrives in its reserved slot.
    unhold_valid, unhold_chiplet, unhold_expert : Out
        A pre-loaded expert was dispatched: its held slots may stream.
    retire_valid, retire_expert : In x chiplets
        A micro-slice finished its last station.
    done : Out(stream.Signature(chiplets))
        Mask of entry slots whose expert retired all ``micro_slices`` micro-slices; bits
        collect while ``ready`` is low.
    ddr_stall : In(1)
        DDR busy this cycle: no issue, no delivery (test hook).
    bad_dispatch, orphan : Out(1)
        Sticky error flags (``orphan``: a retirement matched no job).
    busy : Out(1)

    tokens : In(stream.Signature(tokens_layout)), always ready; only with ``hot_window``
        The token-table writes of the array: which (chiplet, expert) pairs make an expert
        compute-heavy there ([D12]: one micro-slice computes longer than a DDR interval).

    Throughput: one load per ``ddr_interval`` cycles; latency ``ddr_latency`` cycles from
    issue to delivery (more while stalled).  With ``hot_window`` a compute-heavy running
    expert loads only while fewer than ``hot_window`` of its micro-slices are loaded and not
    retired.
    """

    def __init__(self, p: DatapathParams):
        check_chiplet(self, p)
        self.p = p
        n = p.chiplets
        super().__init__(
            {
                "dispatch": In(stream.Signature(dispatch_layout(p))),
                "free": In(p.free_bits).array(n),
                "accept": In(1).array(n),
                "resv_valid": Out(1).array(n),
                "resv_slot": In(p.slot_bits).array(n),
                "deliver_valid": Out(1),
                "deliver": Out(delivery_layout(p)),
                "unhold_valid": Out(1),
                "unhold_chiplet": Out(p.chiplet_bits),
                "unhold_expert": Out(p.expert_bits),
                "retire_valid": In(1).array(n),
                "retire_expert": In(p.expert_bits).array(n),
                "done": Out(stream.Signature(n)),
                "ddr_stall": In(1),
                "bad_dispatch": Out(1),
                "orphan": Out(1),
                "busy": Out(1),
                **({"tokens": In(stream.Signature(tokens_layout(p)))} if p.hot_window else {}),
            }
        )

    def _hot_window(self, m, jexpert, jtraj, jloaded, jretired) -> list:
        """[D12] Per job: may it load (always, unless compute-heavy at its window)."""
        p, n = self.p, self.p.chiplets
        if not p.hot_window:
            return [Const(1)] * n
        # heavy[e] bit c: max(1, tokens of e on c) * cycles_per_token > ddr_interval
        heavy = Array(Signal(n, name=f"heavy{e}") for e in range(p.experts))
        t = self.tokens.payload
        m.d.comb += self.tokens.ready.eq(1)
        with m.If(self.tokens.valid & (t.chiplet < n) & (t.expert < p.experts)):
            cycles = Mux(t.count == 0, 1, t.count) * p.cycles_per_token
            m.d.sync += heavy[t.expert].bit_select(t.chiplet, 1).eq(cycles > p.ddr_interval)
        out = []
        for j in range(n):
            ok = Signal(name=f"job_window_ok{j}")
            hot = (heavy[jexpert[j]] & jtraj[j]).any()
            m.d.comb += ok.eq(~hot | (jloaded[j] - jretired[j] < p.hot_window))
            out.append(ok)
        return out

    def elaborate(self, platform):
        p = self.p
        n, M, P = p.chiplets, p.micro_slices, p.preload_entries
        m = Module()
        age_bits = bits_for(p.ddr_latency + 1) + 8
        depth = -(-p.ddr_latency // p.ddr_interval) + 2
        ld_bits = bits_for(M + 1)
        entry_layout = data.StructLayout({"d": delivery_layout(p), "ts": age_bits})
        m.submodules.queue = q = fifo.SyncFIFO(width=entry_layout.size, depth=depth)

        now = Signal(age_bits)
        gap = Signal(max(1, (p.ddr_interval - 1).bit_length()))
        rr = Signal(p.chiplet_bits)
        m.d.sync += now.eq(now + 1)

        # -- the dispatch beat ------------------------------------------------------------
        b = self.dispatch.payload
        bv = self.dispatch.valid
        m.d.comb += self.dispatch.ready.eq(1)
        b_hops = path_hops(m, p, b.traj, "beat")
        b_legs = Signal(p.chiplet_bits)
        m.d.comb += b_legs.eq(sum(b.traj[a] for a in range(n)) - 1)
        b_ok = Signal()
        # range checks only where the field can encode an out-of-range value
        in_range = Const(1)
        if n < 2**p.chiplet_bits:
            in_range = in_range & (b.entry < n)
        if p.experts < 2**p.expert_bits:
            in_range = in_range & (b.expert < p.experts)
        m.d.comb += b_ok.eq((b.traj != 0) & in_range & b.traj.bit_select(b.entry, 1))

        # -- job and pre-load tables ------------------------------------------------------
        def table(name, count, width):
            return Array(Signal(width, name=f"{name}{i}") for i in range(count))

        jvalid, jexpert = table("job_valid", n, 1), table("job_expert", n, p.expert_bits)
        jtraj, jlegs = table("job_traj", n, n), table("job_legs", n, p.chiplet_bits)
        jloaded, jretired = table("job_loaded", n, ld_bits), table("job_retired", n, ld_bits)
        # chiplet of the job's next load: Rule 4 stripes an expert's loads over its trajectory
        jnext = table("job_next", n, p.chiplet_bits)
        # hops of a load on each chiplet (only the entry's is used without Rule 5)
        jneed = [table(f"job{j}_need", n, p.hop_bits) for j in range(n)]
        pvalid, pexpert = table("pre_valid", P, 1), table("pre_expert", P, p.expert_bits)
        ptraj, pchip = table("pre_traj", P, n), table("pre_chiplet", P, p.chiplet_bits)
        pload, pneed = table("pre_loaded", P, ld_bits), table("pre_need", P, p.hop_bits)
        plegs = table("pre_legs", P, p.chiplet_bits)

        # -- issue -------------------------------------------------------------------------
        free2 = [Signal(p.free_bits, name=f"free2_{a}") for a in range(n)]
        for a in range(n):
            m.d.comb += free2[a].eq(self.free[a] - self.accept[a])
        can_issue = Signal()
        m.d.comb += can_issue.eq((gap == 0) & ~self.ddr_stall & q.w_rdy)

        window_ok = self._hot_window(m, jexpert, jtraj, jloaded, jretired)
        job_ok, job_tgt, job_need = [], [], []
        for j in range(n):
            ok = Signal(name=f"job_ok{j}")
            tgt = Signal(p.chiplet_bits, name=f"job_tgt{j}")
            room = jvalid[j] & (jloaded[j] < M) & window_ok[j]
            if not p.rule5:
                m.d.comb += [
                    ok.eq(room & (Array(free2)[jnext[j]] > jneed[j][jnext[j]])),
                    tgt.eq(jnext[j]),
                ]
            else:
                best_v, best_f, best_a = Const(0), Const(0, p.free_bits), Const(0, p.chiplet_bits)
                for a in range(n):
                    cand = jtraj[j][a] & (free2[a] > jneed[j][a])
                    take = Signal(name=f"job{j}_r5take{a}")
                    nv, nf = (
                        Signal(name=f"job{j}_r5v{a}"),
                        Signal(p.free_bits, name=f"job{j}_r5f{a}"),
                    )
                    na = Signal(p.chiplet_bits, name=f"job{j}_r5a{a}")
                    m.d.comb += [
                        take.eq(cand & (~best_v | (free2[a] > best_f))),
                        nv.eq(best_v | cand),
                        nf.eq(Mux(take, free2[a], best_f)),
                        na.eq(Mux(take, a, best_a)),
                    ]
                    best_v, best_f, best_a = nv, nf, na
                m.d.comb += [ok.eq(room & best_v), tgt.eq(best_a)]
            job_ok.append(ok)
            job_tgt.append(tgt)
            need = Signal(p.hop_bits, name=f"job_need_sel{j}")
            m.d.comb += need.eq(jneed[j][tgt])
            job_need.append(need)
        any_job, jpick = rr_pick(job_ok, rr, p.chiplet_bits)
        pre_ok = [Signal(name=f"pre_ok{k}") for k in range(P)]
        for k in range(P):
            m.d.comb += pre_ok[k].eq(
                pvalid[k] & (pload[k] < M) & (Array(free2)[pchip[k]] > p.max_hops + 1)
            )
        pre_vec = Cat(*pre_ok) if P else Const(0, 1)
        ppick = Signal(max(1, bits_for(P)))
        m.d.comb += ppick.eq(lowest_bit(pre_vec, max(P, 1), max(1, bits_for(P))))
        issue_job = Signal()
        issue_pre = Signal()
        m.d.comb += [
            issue_job.eq(can_issue & any_job),
            issue_pre.eq(can_issue & ~any_job & pre_vec.any()),
        ]

        target = Signal(p.chiplet_bits)
        w = Signal(entry_layout)
        tgts = Array(job_tgt)
        with m.If(issue_job):
            m.d.comb += [
                target.eq(tgts[jpick]),
                w.d.packet.expert.eq(jexpert[jpick]),
                w.d.packet.index.eq(jloaded[jpick]),
                w.d.packet.traj.eq(jtraj[jpick]),
                w.d.packet.legs.eq(jlegs[jpick]),
                w.d.packet.r.eq(Array(job_need)[jpick]),
                w.d.held.eq(0),
            ]
        with m.Elif(issue_pre):
            m.d.comb += [
                target.eq(pchip[ppick]),
                w.d.packet.expert.eq(pexpert[ppick]),
                w.d.packet.index.eq(pload[ppick]),
                w.d.packet.traj.eq(ptraj[ppick]),
                w.d.packet.legs.eq(plegs[ppick]),
                w.d.packet.r.eq(pneed[ppick]),
                w.d.held.eq(1),
            ]
        m.d.comb += [
            w.d.target.eq(target),
            w.d.slot.eq(Array(self.resv_slot)[target]),
            w.d.packet.dest.eq(target),
            w.ts.eq(now),
            q.w_data.eq(w.as_value()),
            q.w_en.eq(issue_job | issue_pre),
        ]
        for a in range(n):
            m.d.comb += self.resv_valid[a].eq((issue_job | issue_pre) & (target == a))
        with m.If(issue_job | issue_pre):
            m.d.sync += gap.eq(p.ddr_interval - 1)
        with m.Elif(gap != 0):
            m.d.sync += gap.eq(gap - 1)
        # the chiplet after the target on the picked job's ring
        after = Signal(p.chiplet_bits)
        picked_traj = Signal(n)
        m.d.comb += picked_traj.eq(jtraj[jpick])
        hops_after = ring_next_hops(picked_traj, n, p.chiplet_bits)
        m.d.comb += after.eq(Array(hops_after)[target])
        with m.If(issue_job):
            m.d.sync += [
                jloaded[jpick].eq(jloaded[jpick] + 1),
                jnext[jpick].eq(after),
                rr.eq(Mux(jpick == n - 1, 0, jpick + 1)),
            ]
        with m.If(issue_pre):
            m.d.sync += pload[ppick].eq(pload[ppick] + 1)

        # -- delivery -----------------------------------------------------------------------
        head = Signal(entry_layout)
        m.d.comb += head.as_value().eq(q.r_data)
        age = Signal(age_bits)
        m.d.comb += age.eq(now - head.ts)
        deliver = Signal()
        m.d.comb += [
            deliver.eq(q.r_rdy & ~self.ddr_stall & (age >= p.ddr_latency)),
            q.r_en.eq(deliver),
        ]
        job_has = Const(0)
        for j in range(n):
            job_has = job_has | (jvalid[j] & (jexpert[j] == head.d.packet.expert))
        beat_has = bv & (b.kind == BeatKind.DISPATCH) & (b.expert == head.d.packet.expert)
        m.d.comb += [
            self.deliver_valid.eq(deliver),
            self.deliver.target.eq(head.d.target),
            self.deliver.slot.eq(head.d.slot),
            self.deliver.packet.eq(head.d.packet),
            self.deliver.held.eq(head.d.held & ~job_has & ~beat_has),
        ]

        # -- dispatch and pre-load beats ------------------------------------------------
        pfree = Cat(*[~pvalid[k] for k in range(P)]) if P else Const(0, 1)
        pslot = Signal(max(1, bits_for(P)))
        m.d.comb += pslot.eq(lowest_bit(pfree, max(P, 1), max(1, bits_for(P))))
        hit_vec = (
            Cat(*[pvalid[k] & (pexpert[k] == b.expert) for k in range(P)]) if P else Const(0, 1)
        )
        hit = Signal(max(1, bits_for(P)))
        m.d.comb += hit.eq(lowest_bit(hit_vec, max(P, 1), max(1, bits_for(P))))
        bad = Signal(init=0)
        m.d.comb += self.bad_dispatch.eq(bad)
        with m.If(bv):
            with m.If(~b_ok):
                m.d.sync += bad.eq(1)
            with m.Elif(b.kind == BeatKind.PRELOAD):
                if P:
                    with m.If(pfree.any()):
                        m.d.sync += [
                            pvalid[pslot].eq(1),
                            pexpert[pslot].eq(b.expert),
                            ptraj[pslot].eq(b.traj),
                            pchip[pslot].eq(b.entry),
                            pload[pslot].eq(0),
                            plegs[pslot].eq(b_legs),
                            pneed[pslot].eq(Array(b_hops)[b.entry]),
                        ]
            with m.Elif(jvalid[b.entry]):
                m.d.sync += bad.eq(1)
            with m.Else():
                loaded = Signal(ld_bits)
                if P:
                    m.d.comb += loaded.eq(
                        Mux(hit_vec.any(), pload[hit] + (issue_pre & (ppick == hit)), 0)
                    )
                    with m.If(hit_vec.any()):
                        m.d.sync += pvalid[hit].eq(0)
                        m.d.comb += [
                            self.unhold_valid.eq(1),
                            self.unhold_chiplet.eq(pchip[hit]),
                            self.unhold_expert.eq(b.expert),
                        ]
                with m.Switch(b.entry):
                    for j in range(n):
                        with m.Case(j):
                            m.d.sync += [
                                jvalid[j].eq(1),
                                jexpert[j].eq(b.expert),
                                jtraj[j].eq(b.traj),
                                jlegs[j].eq(b_legs),
                                jloaded[j].eq(loaded),
                                jretired[j].eq(0),
                                jnext[j].eq(j),
                            ]
                            m.d.sync += [jneed[j][a].eq(b_hops[a]) for a in range(n)]

        # -- retirement and done --------------------------------------------------------------
        done_new = Signal(n)
        orphan = Signal()
        m.d.comb += self.orphan.eq(orphan)
        for c in range(n):
            matched = Const(0)
            for j in range(n):
                matched = matched | (jvalid[j] & (jexpert[j] == self.retire_expert[c]))
            with m.If(self.retire_valid[c] & ~matched):
                m.d.sync += orphan.eq(1)
        for j in range(n):
            inc = sum(
                self.retire_valid[c] & (self.retire_expert[c] == jexpert[j]) for c in range(n)
            )
            total = Signal(ld_bits + 1, name=f"job_total{j}")
            m.d.comb += total.eq(jretired[j] + inc)
            with m.If(jvalid[j] & (inc != 0)):
                m.d.sync += jretired[j].eq(total)
                with m.If(total >= M):
                    m.d.sync += jvalid[j].eq(0)
                    m.d.comb += done_new[j].eq(1)
        pending = Signal(n)
        m.d.comb += [self.done.valid.eq(pending != 0), self.done.payload.eq(pending)]
        m.d.sync += pending.eq(Mux(self.done.valid & self.done.ready, 0, pending) | done_new)

        busy = Const(0)
        for j in range(n):
            busy = busy | jvalid[j]
        for k in range(P):
            busy = busy | pvalid[k]
        m.d.comb += self.busy.eq(busy | q.r_rdy | (pending != 0))
        return m
