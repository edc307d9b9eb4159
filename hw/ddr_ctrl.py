"""DDR controller of the chiplet array: expert jobs from the scheduler's dispatch stream,
micro-slice loads (Rules 4 and 5, Rule 4 pre-loads, remote loads with a channel per chiplet),
delivery after the DDR latency, retirement and the ``done`` stream back to the scheduler.

Golden model: steps 3, 4 and 6 of :meth:`fsedp.sw.streaming.StreamingArray.step`
(:mod:`fsedp.sw.streaming.ddr`).  Doc page: ``docs/blocks/datapath.md``.
"""

from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import (
    check_chiplet,
    first_set,
    lowest_bit,
    ring_next_hops,
    rr_pick,
    tree_sum,
)
from fsedp.hw.layouts import delivery_layout, dispatch_layout, slices_layout, tokens_layout
from fsedp.hw.ring_buffer import (
    DeliverySignature,
    ReservationSignature,
    RetireSignature,
    UnholdSignature,
)
from fsedp.params import BeatKind, DatapathParams, bits_for

__all__ = ["DDRController", "path_hops", "remote_entry"]


def path_hops(m: Module, p: DatapathParams, traj, name: str) -> list:
    """Per chiplet ``a``: XY hops of a micro-slice of ``traj`` loaded on ``a`` (all ring
    legs but the one into ``a``); mirrors :meth:`DatapathParams.path_hops`."""
    n = p.chiplets
    nh = []
    for a, hop in enumerate(ring_next_hops(traj, n, p.chiplet_bits, p.ring_table(0)[0])):
        s = Signal(p.chiplet_bits, name=f"{name}_next{a}")
        m.d.comb += s.eq(hop)
        nh.append(s)
    dist = [Array(Const(p.distance(a, b), p.hop_bits) for b in range(n)) for a in range(n)]
    legs = [Signal(p.hop_bits, name=f"{name}_leg{a}") for a in range(n)]
    for a in range(n):
        m.d.comb += legs[a].eq(Mux(traj[a], dist[a][nh[a]], 0))
    ring = Signal(p.hop_bits + bits_for(n + 1), name=f"{name}_ring")
    m.d.comb += ring.eq(tree_sum(legs))
    out = []
    for a in range(n):
        into = Const(0, p.hop_bits)
        for b in range(n):
            into = Mux(traj[b] & (nh[b] == a), p.distance(b, a), into)
        h = Signal(p.hop_bits, name=f"{name}_hops{a}")
        m.d.comb += h.eq(ring - into)
        out.append(h)
    return out


def remote_entry(m: Module, p: DatapathParams, traj, hops: list, name: str) -> tuple:
    """Per chiplet ``a``: where a micro-slice of ``traj`` loaded on ``a`` enters the
    trajectory and its whole path's hops (``hops``: :func:`path_hops` of ``traj``); mirrors
    :meth:`DatapathParams.remote_entry` (the shortest path, ties to the lower chiplet)."""
    n = p.chiplets
    dests, paths = [], []
    for a in range(n):
        best_v, best_r, best_d = Const(0), Const(0, p.hop_bits), Const(0, p.chiplet_bits)
        for j in range(n):
            # a signal per step keeps the expression linear (best_r is read twice per step)
            r = hops[j] + p.distance(a, j)
            take = traj[j] & (~best_v | (r < best_r))
            nv = Signal(name=f"{name}_r{a}_v{j}")
            nr = Signal(p.hop_bits, name=f"{name}_r{a}_hops{j}")
            nd = Signal(p.chiplet_bits, name=f"{name}_r{a}_dest{j}")
            m.d.comb += [
                nv.eq(best_v | traj[j]),
                nr.eq(Mux(take, r, best_r)),
                nd.eq(Mux(take, j, best_d)),
            ]
            best_v, best_r, best_d = nv, nr, nd
        dests.append(best_d)
        paths.append(best_r)
    return dests, paths


class _Fixed:
    """A table every entry of which is one constant (``micro_slices`` without
    ``slice_table``)."""

    def __init__(self, value):
        self.value = value

    def __getitem__(self, index):
        return self.value


class DDRController(wiring.Component):
    """Jobs, loads and completions of the chiplet array.

    Members
    -------
    dispatch : In(stream.Signature(dispatch_layout)), always ready
        DISPATCH opens the job of entry slot ``entry``; PRELOAD opens a pre-load entry
        (dropped when all ``preload_entries`` are in use).  A beat with an empty trajectory,
        an entry outside it, an out-of-range expert, or a DISPATCH to a busy entry slot is
        ignored and sets the sticky ``bad_dispatch``.
    free : In x chiplets
        Each ring buffer's free slots (registered state: this cycle's loads are admitted
        first, the routers' accepts take what they leave, [D19]).
    admit : In x chiplets; only with forward-state admission
        Each ring buffer's admission vector for loads ([D16], [D20]: the ring buffer's
        ``admit_load``): a load that claims ``r`` may go into chiplet ``a`` iff
        ``admit[a][r]``.  ``resv.claim`` carries the load's claim to the
        reserved slot (and to the router, which admits its arrival after it).
    resv : Out(ReservationSignature) x chiplets
        Slot reservation of the load issued into each chiplet this cycle.
    deliver : Out(DeliverySignature) x ddr_channels, always ready
        Per channel, a load arrives in its reserved slot (channel ``c`` of a channel per
        chiplet always delivers into chiplet ``c``; its micro-slice may be for another one's
        trajectory: a remote load, [D10]).
    unhold : Out(UnholdSignature), always ready
        A pre-loaded expert was dispatched: its held slots may stream (on
        ``payload.chiplet`` with one channel; on every chiplet with a channel per chiplet,
        ``payload.chiplet`` then 0).
    retire : In(RetireSignature) x chiplets, always ready
        A micro-slice of ``payload`` finished its last station on that chiplet.
    done : Out(stream.Signature(chiplets))
        Mask of entry slots whose expert retired all its micro-slices (``micro_slices``, or
        its slice-table entry); bits collect while ``ready`` is low.
    ddr_stall : In(1)
        DDR busy this cycle (every channel): no issue, no delivery (test hook).
    bad_dispatch, orphan : Out(1)
        Sticky error flags (``orphan``: a retirement matched no job).
    busy : Out(1)

    tokens : In(stream.Signature(tokens_layout)), always ready; only with ``hot_window``
        The token-table writes of the array: which (chiplet, expert) pairs make an expert
        compute-heavy there ([D12]: one micro-slice computes longer than a DDR interval).
    slices : In(stream.Signature(slices_layout)), always ready; only with ``slice_table``
        Slice-table writes ([D13]): ``expert`` streams ``count`` micro-slices.  A write with
        ``count`` outside ``1 .. micro_slices`` (or an expert out of range) is ignored; reset
        returns every entry to ``micro_slices``.  A job or pre-load takes its count from the
        table at its beat (a dispatch that takes over a pre-load keeps the pre-load's), so a
        write changes the experts dispatched after it.

    Latency: :attr:`latency` cycles from issue (``resv.valid``) to delivery
    (``deliver.valid``), more while stalled.  Throughput: one load per ``ddr_interval``
    cycles per channel.  One channel (``ddr_channels = 1``)
    loads the running experts round-robin, each striped over its trajectory (Rule 4) or into
    its emptiest chiplet (Rule 5), then pre-loads.  A channel per chiplet is chiplet-driven:
    in one cycle every chiplet with an idle channel loads for the first running expert
    (round-robin) that covers it, else for the first pre-load that covers it, else (Rule 4
    only) a remote load: a running expert's, or a pre-load's, micro-slice that enters the
    trajectory at :func:`remote_entry`.  With ``hot_window`` a compute-heavy running expert
    loads only while fewer than ``hot_window`` of its micro-slices are loaded and not
    retired.
    """

    def __init__(self, p: DatapathParams):
        check_chiplet(self, p)
        self.p = p
        n, nc = p.chiplets, p.ddr_channels
        tokens, slices, hw, st = tokens_layout(p), slices_layout(p), p.hot_window, p.slice_table
        super().__init__(
            {
                "dispatch": In(stream.Signature(dispatch_layout(p), always_ready=True)),
                "free": In(p.free_bits).array(n),
                **(
                    {"admit": In(p.held_claim + 1).array(n)}
                    if p.admission == "forward-state"
                    else {}
                ),
                "resv": Out(ReservationSignature(p)).array(n),
                "deliver": Out(DeliverySignature(p)).array(nc),
                "unhold": Out(UnholdSignature(p)),
                "retire": In(RetireSignature(p)).array(n),
                "done": Out(stream.Signature(n)),
                "ddr_stall": In(1),
                "bad_dispatch": Out(1),
                "orphan": Out(1),
                "busy": Out(1),
                **({"tokens": In(stream.Signature(tokens, always_ready=True))} if hw else {}),
                **({"slices": In(stream.Signature(slices, always_ready=True))} if st else {}),
            }
        )

    @property
    def latency(self) -> int:
        """Cycles from a load's issue (``resv.valid`` in cycle 0) to its delivery
        (``deliver.valid`` in cycle ``latency``) without DDR stalls: the queue entry's age
        reaches ``ddr_latency`` (at least 1, when the queue is first readable)."""
        return self.p.ddr_latency

    def _room(self, a, need):
        """Whether chiplet ``a`` (an index or a signal) admits a load that claims ``need``
        this cycle, on the registered state ([D19]: the loads first): forward-count, more
        than ``need`` slots free; forward-state [D16], the ring buffer's ``admit_load[need]``
        ([D20])."""
        if self.p.admission != "forward-state":
            return (self.free[a] if isinstance(a, int) else Array(self.free)[a]) > need
        admit = self.admit[a] if isinstance(a, int) else Array(self.admit)[a]
        return admit.bit_select(need, 1)

    def _hot(self, m, t) -> list | None:
        """[D12] Per job: whether it is compute-heavy on its trajectory (``None`` without
        ``hot_window``)."""
        p, n = self.p, self.p.chiplets
        if not p.hot_window:
            return None
        # heavy[e] bit c: max(1, tokens of e on c) * cycles_per_token > ddr_interval
        heavy = Array(Signal(n, name=f"heavy{e}") for e in range(p.experts))
        tk = self.tokens.payload
        with m.If(self.tokens.valid & (tk.chiplet < n) & (tk.expert < p.experts)):
            cycles = Mux(tk.count == 0, 1, tk.count) * p.cycles_per_token
            m.d.sync += heavy[tk.expert].bit_select(tk.chiplet, 1).eq(cycles > p.ddr_interval)
        return [(heavy[t.jexpert[j]] & t.jtraj[j]).any() for j in range(n)]

    def _window(self, m, t, hot, j: int, extra, name: str):
        """[D12] Whether job ``j`` may load one more micro-slice, ``extra`` of them being
        issued earlier in this cycle (mirrors ``within_window``)."""
        if hot is None:
            return Const(1)
        ok = Signal(name=name)
        loaded = t.jloaded[j] if extra is None else t.jloaded[j] + extra
        m.d.comb += ok.eq(~hot[j] | (loaded - t.jretired[j] < self.p.hot_window))
        return ok

    # -- one package-level channel ---------------------------------------------------------
    def _issue_package(self, m, t, can_issue, hot, rr) -> tuple:
        """Rule 4 (striped, ``jnext``) or Rule 5 loads of the running experts, round-robin,
        then the pre-loads: one load per cycle.  Returns ``(w_en, entry, target, after)``
        with ``after(k)`` the pre-load ``k``'s loaded count after this cycle's issue."""
        p = self.p
        n, P = p.chiplets, p.preload_entries
        window_ok = [self._window(m, t, hot, j, None, f"job_window_ok{j}") for j in range(n)]
        job_ok, job_tgt, job_need = [], [], []
        for j in range(n):
            ok = Signal(name=f"job_ok{j}")
            tgt = Signal(p.chiplet_bits, name=f"job_tgt{j}")
            room = t.jvalid[j] & (t.jloaded[j] < t.jcount[j]) & window_ok[j]
            if not p.rule5:
                m.d.comb += [
                    ok.eq(room & self._room(t.jnext[j], t.jneed[j][t.jnext[j]])),
                    tgt.eq(t.jnext[j]),
                ]
            else:
                cand = [t.jtraj[j][a] & self._room(a, t.jneed[j][a]) for a in range(n)]
                best_v, best_a = self._emptiest(m, cand, f"job{j}_r5")
                m.d.comb += [ok.eq(room & best_v), tgt.eq(best_a)]
            job_ok.append(ok)
            job_tgt.append(tgt)
            need = Signal(p.hop_bits, name=f"job_need_sel{j}")
            m.d.comb += need.eq(t.jneed[j][tgt])
            job_need.append(need)
        any_job, jpick = rr_pick(job_ok, rr, p.chiplet_bits)
        pre_ok = [Signal(name=f"pre_ok{k}") for k in range(P)]
        for k in range(P):
            m.d.comb += pre_ok[k].eq(
                t.pvalid[k] & (t.pload[k] < t.pcount[k]) & self._room(t.pchip[k], p.held_claim)
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
        w = Signal(t.entry_layout)
        tgts = Array(job_tgt)
        with m.If(issue_job):
            m.d.comb += [
                target.eq(tgts[jpick]),
                w.d.packet.expert.eq(t.jexpert[jpick]),
                w.d.packet.index.eq(t.jloaded[jpick]),
                w.d.packet.traj.eq(t.jtraj[jpick]),
                w.d.packet.legs.eq(t.jlegs[jpick]),
                w.d.packet.r.eq(Array(job_need)[jpick]),
                w.d.held.eq(0),
            ]
        with m.Elif(issue_pre):
            m.d.comb += [
                target.eq(t.pchip[ppick]),
                w.d.packet.expert.eq(t.pexpert[ppick]),
                w.d.packet.index.eq(t.pload[ppick]),
                w.d.packet.traj.eq(t.ptraj[ppick]),
                w.d.packet.legs.eq(t.plegs[ppick]),
                w.d.packet.r.eq(t.pneed[ppick]),
                w.d.held.eq(1),
            ]
        m.d.comb += [w.d.target.eq(target), w.d.packet.dest.eq(target)]
        # the chiplet after the target on the picked job's ring
        after = Signal(p.chiplet_bits)
        picked_traj = Signal(n)
        m.d.comb += picked_traj.eq(t.jtraj[jpick])
        hops_after = ring_next_hops(picked_traj, n, p.chiplet_bits, p.ring_table(0)[0])
        m.d.comb += after.eq(Array(hops_after)[target])
        with m.If(issue_job):
            m.d.sync += [
                t.jloaded[jpick].eq(t.jloaded[jpick] + 1),
                t.jnext[jpick].eq(after),
                rr.eq(Mux(jpick == n - 1, 0, jpick + 1)),
            ]
        with m.If(issue_pre):
            m.d.sync += t.pload[ppick].eq(t.pload[ppick] + 1)
        return issue_job | issue_pre, w, target, lambda k: t.pload[k] + (issue_pre & (ppick == k))

    def _emptiest(self, m, cand: list, name: str) -> tuple:
        """Rule 5: the candidate chiplet with the most free slots (ties to the lower one):
        ``(any, chiplet)``."""
        p = self.p
        best_v, best_f, best_a = Const(0), Const(0, p.free_bits), Const(0, p.chiplet_bits)
        for a, ok in enumerate(cand):
            take = Signal(name=f"{name}take{a}")
            nv, nf = Signal(name=f"{name}v{a}"), Signal(p.free_bits, name=f"{name}f{a}")
            na = Signal(p.chiplet_bits, name=f"{name}a{a}")
            m.d.comb += [
                take.eq(ok & (~best_v | (self.free[a] > best_f))),
                nv.eq(best_v | ok),
                nf.eq(Mux(take, self.free[a], best_f)),
                na.eq(Mux(take, a, best_a)),
            ]
            best_v, best_f, best_a = nv, nf, na
        return best_v, best_a

    # -- a channel per chiplet, Rule 4 ---------------------------------------------------------
    def _quotas(self, m, t, hot) -> tuple:
        """Per job and pre-load entry, the micro-slices it may load this cycle, capped at
        ``n`` (no more chiplets pick it): its micro-slices left, and for a compute-heavy job
        the room left in its ``hot_window`` ([D12]; mirrors ``ddr.window_quota``)."""
        p = self.p
        n, P = p.chiplets, p.preload_entries
        qb = bits_for(n + 1)
        cap = Const(n, qb)
        quota, pquota = [], []
        for j in range(n):
            left = Signal(len(t.jloaded[j]), name=f"job_left{j}")
            m.d.comb += left.eq(t.jcount[j] - t.jloaded[j])
            lim = left
            if hot is not None:
                inflight = t.jloaded[j] - t.jretired[j]
                room = Signal(bits_for(p.hot_window + 1), name=f"job_window_left{j}")
                m.d.comb += room.eq(Mux(inflight < p.hot_window, p.hot_window - inflight, 0))
                lim = Mux(hot[j] & (room < left), room, left)
            q = Signal(qb, name=f"quota{j}")
            m.d.comb += q.eq(Mux(t.jvalid[j], Mux(lim < cap, lim, cap), 0))
            quota.append(q)
        for k in range(P):
            left = t.pcount[k] - t.pload[k]
            q = Signal(qb, name=f"pre_quota{k}")
            m.d.comb += q.eq(Mux(t.pvalid[k], Mux(left < cap, left, cap), 0))
            pquota.append(q)
        return quota, pquota

    def _grants(self, m, picks, quota, name: str) -> tuple:
        """Grants of one kind of pick (jobs or pre-load entries): ``picks`` is, per phase
        (local, then remote), per chiplet ``(valid, index)``; a pick of ``x`` is granted
        while the picks of ``x`` before it (earlier phase, or lower chiplet) are fewer than
        ``quota[x]``: a prefix count per ``x``, not a chain over the chiplets.  Returns,
        per phase and chiplet, ``(granted, rank)`` (``rank``: the micro-slices of ``x``
        issued before it this cycle) and per ``x`` the grants."""
        n = self.p.chiplets
        nx = len(quota)
        qb = bits_for(n + 1)
        base = [Const(0, qb)] * nx  # grants of the earlier phases
        out, granted = [], [[] for _ in range(nx)]
        for ph, phase in enumerate(picks):
            hits = [[v & (i == x) for x in range(nx)] for v, i in phase]
            rows = []
            for c in range(n):
                g_any, r_any = Const(0), Const(0, qb)
                for x in range(nx):
                    before = Signal(qb, name=f"{name}{ph}_c{c}_before{x}")
                    m.d.comb += before.eq(base[x] + tree_sum(hits[d][x] for d in range(c)))
                    g = Signal(name=f"{name}{ph}_c{c}_grant{x}")
                    m.d.comb += g.eq(hits[c][x] & (before < quota[x]))
                    granted[x].append(g)
                    g_any = g_any | g
                    r_any = r_any | Mux(hits[c][x], before, 0)
                gs, rs = Signal(name=f"{name}{ph}_grant{c}"), Signal(qb, name=f"{name}{ph}_rank{c}")
                m.d.comb += [gs.eq(g_any), rs.eq(r_any)]
                rows.append((gs, rs))
            out.append(rows)
            nbase = []
            for x in range(nx):
                total = Signal(qb + 1, name=f"{name}{ph}_picks{x}")
                m.d.comb += total.eq(base[x] + tree_sum(hits[c][x] for c in range(n)))
                b = Signal(qb, name=f"{name}{ph}_base{x}")
                m.d.comb += b.eq(Mux(total < quota[x], total, quota[x]))
                nbase.append(b)
            base = nbase
        return out, granted

    def _issue_chiplets(self, m, t, can_issue, hot, rr) -> tuple:
        """Chiplet-driven Rule 4 issue (mirrors :func:`fsedp.sw.streaming.ddr.per_chiplet`,
        [D18]): every chiplet's pick from the cycle's starting state, in parallel (a local
        load, else a local pre-load, else a remote load, else a remote pre-load), then the
        grants up to each job's and entry's quota (:meth:`_grants`).  Depth: a round-robin
        pick and a prefix count, independent of the other chiplets' picks.  Returns
        ``(w_en, entry)`` per channel and ``after(k)``."""
        p = self.p
        n, P, cb = p.chiplets, p.preload_entries, p.chiplet_bits
        pb = max(1, bits_for(P))
        top = p.held_claim
        quota, pquota = self._quotas(m, t, hot)
        lj, lp, rj, rp = [], [], [], []  # per chiplet: (valid, index)
        for c in range(n):
            elig = []
            for j in range(n):
                e = Signal(name=f"a{c}_elig{j}")
                m.d.comb += e.eq((quota[j] != 0) & t.jtraj[j][c] & self._room(c, t.jneed[j][c]))
                elig.append(e)
            any_l, pick_l = rr_pick(elig, rr, cb)
            room_top = self._room(c, top)
            if P:
                any_p, pick_p = first_set([(pquota[k] != 0) & t.ptraj[k][c] for k in range(P)])
            else:
                any_p, pick_p = Const(0), Const(0, pb)
            relig = []
            for j in range(n):
                e = Signal(name=f"c{c}_elig{j}")
                m.d.comb += e.eq((quota[j] != 0) & self._room(c, t.jrr[j][c]))
                relig.append(e)
            any_r, pick_r = rr_pick(relig, rr, cb)
            if P:
                any_q, pick_q = first_set([pquota[k] != 0 for k in range(P)])
            else:
                any_q, pick_q = Const(0), Const(0, pb)
            v = [Signal(name=f"c{c}_pick_{s}") for s in ("a", "b", "c", "c_pre")]
            x = [
                Signal(cb, name=f"c{c}_job"),
                Signal(pb, name=f"c{c}_pre"),
                Signal(cb, name=f"c{c}_rjob"),
                Signal(pb, name=f"c{c}_rpre"),
            ]
            local_p = room_top & any_p
            m.d.comb += [
                v[0].eq(can_issue[c] & any_l),
                v[1].eq(can_issue[c] & ~any_l & local_p),
                v[2].eq(can_issue[c] & ~any_l & ~local_p & any_r),
                v[3].eq(can_issue[c] & ~any_l & ~local_p & ~any_r & room_top & any_q),
                x[0].eq(pick_l),
                x[1].eq(pick_p),
                x[2].eq(pick_r),
                x[3].eq(pick_q),
            ]
            lj.append((v[0], x[0]))
            lp.append((v[1], x[1]))
            rj.append((v[2], x[2]))
            rp.append((v[3], x[3]))
        (jl, jr), jgrants = self._grants(m, [lj, rj], quota, "job")
        if P:
            (pl, pr), pgrants = self._grants(m, [lp, rp], pquota, "pre")
        else:
            pl = pr = [(Const(0), Const(0, 1))] * n
            pgrants = []

        def job_fields(sel, rank, dest, r):
            return dict(
                expert=t.jexpert[sel], index=t.jloaded[sel] + rank, traj=t.jtraj[sel],
                legs=t.jlegs[sel], dest=dest, r=r, held=0,
            )  # fmt: skip

        def pre_fields(sel, rank, dest, r):
            return dict(
                expert=t.pexpert[sel], index=t.pload[sel] + rank, traj=t.ptraj[sel],
                legs=t.plegs[sel], dest=dest, r=r, held=1,
            )  # fmt: skip

        def col(rows, c, width):
            return Array(rows[x][c] for x in range(width))

        cands = []
        for c in range(n):
            sl, sr = lj[c][1], rj[c][1]
            cc = [
                (jl[c][0], job_fields(sl, jl[c][1], c, col(t.jneed, c, n)[sl])),
                (jr[c][0], job_fields(sr, jr[c][1], col(t.jrd, c, n)[sr], col(t.jrr, c, n)[sr])),
            ]
            if P:
                sp, sq = lp[c][1], rp[c][1]
                rhops = col(t.prr, c, P)
                cc += [
                    (pl[c][0], pre_fields(sp, pl[c][1], c, col(t.pneed, c, P)[sp])),
                    (pr[c][0], pre_fields(sq, pr[c][1], col(t.prd, c, P)[sq], rhops[sq])),
                ]
            cands.append(cc)
        # the round-robin pointer follows the last job issued, in the golden model's order
        # (local loads by chiplet, then remote ones)
        for rows, picks in ((jl, lj), (jr, rj)):
            for c in range(n):
                sel = picks[c][1]
                with m.If(rows[c][0]):
                    m.d.sync += rr.eq(Mux(sel == n - 1, 0, sel + 1))
        ew = bits_for(n + 1)
        for j in range(n):
            inc = Signal(ew, name=f"job_issued{j}")
            m.d.comb += inc.eq(tree_sum(jgrants[j]))
            m.d.sync += t.jloaded[j].eq(t.jloaded[j] + inc)
        pext = []
        for k in range(P):
            inc = Signal(ew, name=f"pre_issued{k}")
            m.d.comb += inc.eq(tree_sum(pgrants[k]))
            m.d.sync += t.pload[k].eq(t.pload[k] + inc)
            pext.append(inc)
        return self._entries(m, t, cands), lambda k: t.pload[k] + Array(pext)[k]

    def _entries(self, m, t, cands) -> tuple:
        """Per channel, its delivery-queue entry from the first of its candidate loads that
        issues: ``(w_en, entry)``."""
        n = self.p.chiplets
        wens, ws = [], []
        for c in range(n):
            w = Signal(t.entry_layout, name=f"w{c}")
            wen = Signal(name=f"w_en{c}")
            first = True
            for iss, f in cands[c]:
                with m.If(iss) if first else m.Elif(iss):
                    m.d.comb += [
                        w.d.packet.expert.eq(f["expert"]),
                        w.d.packet.index.eq(f["index"]),
                        w.d.packet.traj.eq(f["traj"]),
                        w.d.packet.legs.eq(f["legs"]),
                        w.d.packet.dest.eq(f["dest"]),
                        w.d.packet.r.eq(f["r"]),
                        w.d.held.eq(f["held"]),
                    ]
                first = False
            any_iss = Const(0)
            for iss, _ in cands[c]:
                any_iss = any_iss | iss
            m.d.comb += [wen.eq(any_iss), w.d.target.eq(c)]
            wens.append(wen)
            ws.append(w)
        return wens, ws

    # -- a channel per chiplet, Rule 5 ---------------------------------------------------------
    def _issue_per_chiplet(self, m, t, can_issue, hot, rr) -> tuple:
        """Rule 5 with a channel per chiplet (A4; mirrors the ``rule5`` branches of
        :func:`fsedp.sw.streaming.ddr.issue`): the jobs round-robin, each one load into its
        emptiest chiplet whose channel is unused, then the pre-loads chiplet by chiplet.  A
        chain over the jobs and the chiplets (the ablation, not the chip's rule).  Returns
        ``(w_en, entry)`` per channel and ``after(k)``."""
        p = self.p
        n, P, cb = p.chiplets, p.preload_entries, p.chiplet_bits
        ew = bits_for(n + 1)
        # updated in place by every stage
        extra = [Const(0, ew)] * n
        pext = [Const(0, ew)] * P
        # per channel, the candidate loads in priority order: (issue, fields)
        cands = [[] for _ in range(n)]

        def count(prev, issue, sel, j, name):
            s = Signal(ew, name=name)
            m.d.comb += s.eq(prev + (issue & (sel == j)))
            return s

        def job_fields(j, index, dest, r):
            return dict(
                expert=t.jexpert[j], index=index, traj=t.jtraj[j], legs=t.jlegs[j],
                dest=dest, r=r, held=0,
            )  # fmt: skip

        def pre_fields(k, index, dest, r):
            return dict(
                expert=t.pexpert[k], index=index, traj=t.ptraj[k], legs=t.plegs[k],
                dest=dest, r=r, held=1,
            )  # fmt: skip

        def pre_load(tag, c, covers, hops, dests, enable):
            """A held load on chiplet ``c`` for the lowest pre-load entry that ``covers(k)``
            it and has micro-slices left, into room for ``H + 1``; ``hops``/``dests`` as in
            a local Rule 4 load."""
            elig = [
                t.pvalid[k] & covers(k) & (t.pload[k] + pext[k] < t.pcount[k]) for k in range(P)
            ]
            anyp, pick = first_set(elig)
            iss, sel = Signal(name=f"{tag}{c}_issue"), Signal(bits_for(P), name=f"{tag}{c}_pre")
            m.d.comb += [iss.eq(enable & self._room(c, p.held_claim) & anyp), sel.eq(pick)]
            index = Array(t.pload[k] + pext[k] for k in range(P))[sel]
            dest = c if dests is None else Array(dests)[sel]
            cands[c].append((iss, pre_fields(sel, index, dest, Array(hops)[sel])))
            pext[:] = [count(pext[k], iss, sel, k, f"{tag}{c}_extra{k}") for k in range(P)]
            return iss

        # the jobs round-robin, each one load into its emptiest chiplet whose channel is
        # still unused
        used = [Const(0)] * n
        win = [self._window(m, t, hot, j, None, f"job_window_ok{j}") for j in range(n)]
        for k in range(n):
            sel = Signal(cb, name=f"r5_{k}_job")
            s = rr + k
            m.d.comb += sel.eq(Mux(s >= n, s - n, s))
            need = [Array(t.jneed[j][a] for j in range(n))[sel] for a in range(n)]
            traj = t.jtraj[sel]
            cand = [traj[a] & can_issue[a] & ~used[a] & self._room(a, need[a]) for a in range(n)]
            anyc, tgt = self._emptiest(m, cand, f"r5_{k}_")
            iss = Signal(name=f"r5_{k}_issue")
            m.d.comb += iss.eq(
                t.jvalid[sel] & (t.jloaded[sel] < t.jcount[sel]) & Array(win)[sel] & anyc
            )
            for a in range(n):
                hit = iss & (tgt == a)
                cands[a].append((hit, job_fields(sel, t.jloaded[sel], a, need[a])))
                used[a] = used[a] | hit
            with m.If(iss):
                m.d.sync += rr.eq(Mux(sel == n - 1, 0, sel + 1))
            extra[:] = [count(extra[j], iss, sel, j, f"r5_{k}_extra{j}") for j in range(n)]
        local = used
        if P:
            # local pre-loads: the lowest pre-load entry that covers c
            for c in range(n):
                local[c] = local[c] | pre_load(
                    "b",
                    c,
                    lambda k, c=c: t.ptraj[k][c],
                    [t.pneed[k][c] for k in range(P)],
                    None,
                    can_issue[c] & ~local[c],
                )
        for j in range(n):
            m.d.sync += t.jloaded[j].eq(t.jloaded[j] + extra[j])
        for k in range(P):
            m.d.sync += t.pload[k].eq(t.pload[k] + pext[k])
        return self._entries(m, t, cands), lambda k: t.pload[k] + Array(pext)[k]

    def elaborate(self, platform):
        p = self.p
        n, M, P, nc = p.chiplets, p.micro_slices, p.preload_entries, p.ddr_channels
        m = Module()
        age_bits = p.ddr_age_bits
        depth = p.ddr_fifo_depth
        ld_bits = bits_for(M + 1)
        entry_layout = data.StructLayout({"d": delivery_layout(p), "ts": age_bits})
        queues = []
        for ch in range(nc):
            q = fifo.SyncFIFO(width=entry_layout.size, depth=depth)
            m.submodules["queue" if nc == 1 else f"queue{ch}"] = q
            queues.append(q)

        now = Signal(age_bits)
        gap_bits = max(1, (p.ddr_interval - 1).bit_length())
        gaps = [Signal(gap_bits, name="gap" if nc == 1 else f"gap{ch}") for ch in range(nc)]
        rr = Signal(p.chiplet_bits)
        m.d.sync += now.eq(now + 1)

        # -- the dispatch beat ------------------------------------------------------------
        b = self.dispatch.payload
        bv = self.dispatch.valid
        b_hops = path_hops(m, p, b.traj, "beat")
        b_legs = Signal(p.chiplet_bits)
        m.d.comb += b_legs.eq(tree_sum(b.traj[a] for a in range(n)) - 1)
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

        t = SimpleNamespace(entry_layout=entry_layout)
        t.jvalid, t.jexpert = table("job_valid", n, 1), table("job_expert", n, p.expert_bits)
        t.jtraj, t.jlegs = table("job_traj", n, n), table("job_legs", n, p.chiplet_bits)
        t.jloaded, t.jretired = table("job_loaded", n, ld_bits), table("job_retired", n, ld_bits)
        # hops of a load on each chiplet (only the entry's is used with one channel and Rule 4)
        t.jneed = [table(f"job{j}_need", n, p.hop_bits) for j in range(n)]
        t.pvalid, t.pexpert = table("pre_valid", P, 1), table("pre_expert", P, p.expert_bits)
        t.ptraj, t.plegs = table("pre_traj", P, n), table("pre_legs", P, p.chiplet_bits)
        t.pload = table("pre_loaded", P, ld_bits)
        # micro-slices per job and pre-load: the slice table's entry at its beat [D13]
        if p.slice_table:
            t.jcount, t.pcount = table("job_count", n, ld_bits), table("pre_count", P, ld_bits)
            slc = Array(Signal(ld_bits, init=M, name=f"slices{e}") for e in range(p.experts))
            sw = self.slices.payload
            ok = self.slices.valid & (sw.count != 0) & (sw.count <= M)
            if p.experts < 2**p.expert_bits:
                ok = ok & (sw.expert < p.experts)
            with m.If(ok):
                m.d.sync += slc[sw.expert].eq(sw.count)
            b_count = slc[b.expert]
        else:
            t.jcount = t.pcount = _Fixed(Const(M, ld_bits))
            b_count = Const(M, ld_bits)
        if nc == 1:
            # chiplet of the job's next load: Rule 4 stripes an expert's loads over its ring
            t.jnext = table("job_next", n, p.chiplet_bits)
            t.pchip = table("pre_chiplet", P, p.chiplet_bits)
            t.pneed = table("pre_need", P, p.hop_bits)
        else:
            # per chiplet: hops of a local load, entry and hops of a remote one
            t.jrd = [table(f"job{j}_rdest", n, p.chiplet_bits) for j in range(n)]
            t.jrr = [table(f"job{j}_rhops", n, p.hop_bits) for j in range(n)]
            t.pneed = [table(f"pre{k}_need", n, p.hop_bits) for k in range(P)]
            t.prd = [table(f"pre{k}_rdest", n, p.chiplet_bits) for k in range(P)]
            t.prr = [table(f"pre{k}_rhops", n, p.hop_bits) for k in range(P)]
            b_rdest, b_rhops = remote_entry(m, p, b.traj, b_hops, "beat")

        # -- issue -------------------------------------------------------------------------
        # [D19]: the loads are admitted on the ring buffers' registered free counts
        can_issue = []
        for ch, q in enumerate(queues):
            ok = Signal(name="can_issue" if nc == 1 else f"can_issue{ch}")
            m.d.comb += ok.eq((gaps[ch] == 0) & ~self.ddr_stall & q.w_rdy)
            can_issue.append(ok)
        hot = self._hot(m, t)
        if nc == 1:
            wen, w, target, after = self._issue_package(m, t, can_issue[0], hot, rr)
            wens, ws, targets = [wen], [w], [target]
            for a in range(n):
                m.d.comb += self.resv[a].valid.eq(wen & (target == a))
        else:
            issue = self._issue_per_chiplet if p.rule5 else self._issue_chiplets
            (wens, ws), after = issue(m, t, can_issue, hot, rr)
            targets = list(range(n))
            for a in range(n):
                m.d.comb += self.resv[a].valid.eq(wens[a])
        if p.admission == "forward-state":
            # [D16] the reserved slot claims the load's hops, H + 1 while it is held
            for a in range(n):
                w = ws[0] if nc == 1 else ws[a]
                m.d.comb += self.resv[a].claim.eq(Mux(w.d.held, p.held_claim, w.d.packet.r))
        for ch, q in enumerate(queues):
            w = ws[ch]
            m.d.comb += [
                w.d.slot.eq(
                    Array(r.slot for r in self.resv)[targets[ch]] if nc == 1 else self.resv[ch].slot
                ),
                w.ts.eq(now),
                q.w_data.eq(w.as_value()),
                q.w_en.eq(wens[ch]),
            ]
            with m.If(wens[ch]):
                m.d.sync += gaps[ch].eq(p.ddr_interval - 1)
            with m.Elif(gaps[ch] != 0):
                m.d.sync += gaps[ch].eq(gaps[ch] - 1)

        # -- delivery -----------------------------------------------------------------------
        for ch, q in enumerate(queues):
            head = Signal(entry_layout, name="head" if nc == 1 else f"head{ch}")
            m.d.comb += head.as_value().eq(q.r_data)
            age = Signal(age_bits, name="age" if nc == 1 else f"age{ch}")
            m.d.comb += age.eq(now - head.ts)
            deliver = Signal(name="deliver" if nc == 1 else f"deliver{ch}")
            m.d.comb += [
                deliver.eq(q.r_rdy & ~self.ddr_stall & (age >= p.ddr_latency)),
                q.r_en.eq(deliver),
            ]
            job_has = Const(0)
            for j in range(n):
                job_has = job_has | (t.jvalid[j] & (t.jexpert[j] == head.d.packet.expert))
            beat_has = bv & (b.kind == BeatKind.DISPATCH) & (b.expert == head.d.packet.expert)
            out = self.deliver[ch]
            m.d.comb += [
                out.valid.eq(deliver),
                out.payload.target.eq(head.d.target),
                out.payload.slot.eq(head.d.slot),
                out.payload.packet.eq(head.d.packet),
                out.payload.held.eq(head.d.held & ~job_has & ~beat_has),
            ]

        # -- dispatch and pre-load beats ------------------------------------------------
        pfree = Cat(*[~t.pvalid[k] for k in range(P)]) if P else Const(0, 1)
        pslot = Signal(max(1, bits_for(P)))
        m.d.comb += pslot.eq(lowest_bit(pfree, max(P, 1), max(1, bits_for(P))))
        hit_vec = (
            Cat(*[t.pvalid[k] & (t.pexpert[k] == b.expert) for k in range(P)]) if P else Const(0, 1)
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
                            t.pvalid[pslot].eq(1),
                            t.pexpert[pslot].eq(b.expert),
                            t.ptraj[pslot].eq(b.traj),
                            t.pload[pslot].eq(0),
                            t.plegs[pslot].eq(b_legs),
                        ]
                        if p.slice_table:
                            m.d.sync += t.pcount[pslot].eq(b_count)
                        if nc == 1:
                            m.d.sync += [
                                t.pchip[pslot].eq(b.entry),
                                t.pneed[pslot].eq(Array(b_hops)[b.entry]),
                            ]
                        else:
                            with m.Switch(pslot):
                                for k in range(P):
                                    with m.Case(k):
                                        m.d.sync += [
                                            *(t.pneed[k][a].eq(b_hops[a]) for a in range(n)),
                                            *(t.prd[k][a].eq(b_rdest[a]) for a in range(n)),
                                            *(t.prr[k][a].eq(b_rhops[a]) for a in range(n)),
                                        ]
            with m.Elif(t.jvalid[b.entry]):
                m.d.sync += bad.eq(1)
            with m.Else():
                loaded = Signal(ld_bits)
                count = Signal(ld_bits)
                m.d.comb += count.eq(b_count)
                if P:
                    m.d.comb += loaded.eq(Mux(hit_vec.any(), after(hit), 0))
                    if p.slice_table:
                        # taking over a pre-load: the count its loads were made for
                        m.d.comb += count.eq(Mux(hit_vec.any(), t.pcount[hit], b_count))
                    with m.If(hit_vec.any()):
                        m.d.sync += t.pvalid[hit].eq(0)
                        m.d.comb += [
                            self.unhold.valid.eq(1),
                            self.unhold.payload.expert.eq(b.expert),
                        ]
                        if nc == 1:
                            m.d.comb += self.unhold.payload.chiplet.eq(t.pchip[hit])
                with m.Switch(b.entry):
                    for j in range(n):
                        with m.Case(j):
                            m.d.sync += [
                                t.jvalid[j].eq(1),
                                t.jexpert[j].eq(b.expert),
                                t.jtraj[j].eq(b.traj),
                                t.jlegs[j].eq(b_legs),
                                t.jloaded[j].eq(loaded),
                                t.jretired[j].eq(0),
                            ]
                            if p.slice_table:
                                m.d.sync += t.jcount[j].eq(count)
                            m.d.sync += [t.jneed[j][a].eq(b_hops[a]) for a in range(n)]
                            if nc == 1:
                                m.d.sync += t.jnext[j].eq(j)
                            else:
                                m.d.sync += [t.jrd[j][a].eq(b_rdest[a]) for a in range(n)]
                                m.d.sync += [t.jrr[j][a].eq(b_rhops[a]) for a in range(n)]

        # -- retirement and done --------------------------------------------------------------
        done_new = Signal(n)
        orphan = Signal()
        m.d.comb += self.orphan.eq(orphan)
        retire = self.retire
        for c in range(n):
            matched = Const(0)
            for j in range(n):
                matched = matched | (t.jvalid[j] & (t.jexpert[j] == retire[c].payload))
            with m.If(retire[c].valid & ~matched):
                m.d.sync += orphan.eq(1)
        for j in range(n):
            inc = tree_sum(retire[c].valid & (retire[c].payload == t.jexpert[j]) for c in range(n))
            total = Signal(ld_bits + 1, name=f"job_total{j}")
            m.d.comb += total.eq(t.jretired[j] + inc)
            with m.If(t.jvalid[j] & (inc != 0)):
                m.d.sync += t.jretired[j].eq(total)
                with m.If(total >= t.jcount[j]):
                    m.d.sync += t.jvalid[j].eq(0)
                    m.d.comb += done_new[j].eq(1)
        pending = Signal(n)
        m.d.comb += [self.done.valid.eq(pending != 0), self.done.payload.eq(pending)]
        m.d.sync += pending.eq(Mux(self.done.valid & self.done.ready, 0, pending) | done_new)

        busy = Const(0)
        for j in range(n):
            busy = busy | t.jvalid[j]
        for k in range(P):
            busy = busy | t.pvalid[k]
        for q in queues:
            busy = busy | q.r_rdy
        m.d.comb += self.busy.eq(busy | (pending != 0))
        return m
