"""The compiled interpretation of the streaming golden model (numba): the cycle loop of one
FSE-DP layer, :class:`fsedp.sw.streaming.StreamingArray` transliterated onto integer arrays,
with the simulator's per-cycle bookkeeping (``fsedp.sim.fsedp``) and exact event skipping.

This module is the kernel only; :mod:`fsedp.sim.fast` drives it (the scheduler golden model
stays in Python and is called when a job finishes).  Every function mirrors one of the golden
model's, named in its docstring; a change to a rule there must be made here too, and
``tests/test_fast.py`` compares the two event for event.

State arrays (int64):

* ``SL[c, i, f]`` slot ``i`` of chiplet ``c``, field ``f`` (``S_*``);
* ``CH[c, f]`` chiplet fields (``C_*``), ``JB[j, f]`` jobs (``J_*``), ``PR[k, f]`` pre-loads
  (``Q_*``); ``JH[j, a]`` path hops of job ``j``'s trajectory from ``a``, ``JRD``/``JRR`` its
  remote entry (dest, hops) from ``a``; ``QH``/``QRD`` the same for pre-loads;
* ``FF[ch, q, f]`` the DDR delivery queues (``F_*``) with ``FQ[ch, 0]`` head and
  ``FQ[ch, 1]`` length; ``GP[ch]`` the channels' gaps; ``TK[c, e]`` the token tables;
  ``MS[e]`` the slice table (micro-slices expert ``e`` streams, [D13]);
* ``SC[f]`` scalars (``X_*``); ``P[f]`` the parameters (``P_*``).

They travel as two tuples, in the orders :data:`STATE` and :data:`BOOKS` name.
"""

import numpy as np
from numba import njit

#: the state tuple ``S`` of :func:`step` and :func:`run`
STATE = ("P", "NB", "DIRT", "DIST", "SL", "CH", "JB", "JH", "JRD", "JRR", "PR", "QH", "QRD")
STATE += ("FF", "FQ", "GP", "TK", "MS", "SC")
#: the bookkeeping tuple ``B`` of :func:`run`
BOOKS = ("DI", "PI", "DW", "PW", "started", "computed", "expected", "peak", "links")
BOOKS += ("ddr_per", "busy", "TL", "EVL")

# -- parameters ---------------------------------------------------------------------------
P_N, P_K, P_E, P_M, P_CPT, P_LINK, P_DINT, P_DLAT = 0, 1, 2, 3, 4, 5, 6, 7
P_NPRE, P_RULE5, P_CHAN, P_PREEMPT, P_HOT, P_ADMIT, P_AGE, P_FDEPTH = 8, 9, 10, 11, 12, 13, 14, 15
P_H, P_LOG = 16, 17
NP = 18
# -- slot fields ----------------------------------------------------------------------------
S_BUSY, S_RESV, S_WAIT, S_HELD, S_COMP, S_COMPUTING, S_SEND, S_TX = 0, 1, 2, 3, 4, 5, 6, 7
S_DDR, S_FINAL, S_REM, S_DIR, S_R, S_EXPERT, S_INDEX, S_TRAJ, S_DEST, S_LEGS = range(8, 18)
NS = 18
# -- chiplet fields -------------------------------------------------------------------------
C_RR, C_CNT, C_CSLOT, C_CEXPERT, C_CINDEX, C_CFINAL, C_LB = 0, 1, 2, 3, 4, 5, 6  # C_LB..+3
NC = 10
# -- jobs, pre-loads, DDR queue entries ------------------------------------------------------
J_VALID, J_EXPERT, J_TRAJ, J_LOADED, J_RETIRED, J_TARGET, J_COUNT = range(7)
NJ = 7
Q_VALID, Q_EXPERT, Q_TRAJ, Q_CHIPLET, Q_LOADED, Q_COUNT = range(6)
NQ = 6
F_TARGET, F_SLOT, F_EXPERT, F_INDEX, F_TRAJ, F_DEST, F_LEGS, F_R, F_HELD, F_TS = range(10)
NF = 10
# -- scalars --------------------------------------------------------------------------------
X_DDR_RR, X_NOW, X_CYCLE, X_DONE, X_BAD, X_ORPHAN, X_STEPS, X_FF = 0, 1, 2, 3, 4, 5, 6, 7
X_LOADS, X_TRANSFERS, X_COMPUTATIONS, X_DISPATCHED, X_NEV, X_NTL, X_BPOS = range(8, 15)
NX = 15
# -- idle causes (indices into the count arrays; names in fsedp.sim.fast) --------------------
D_STALL, D_FULL, D_ADMISSION, D_PRELOAD, D_WINDOW, D_NONE, D_DISPATCH, D_DRAIN = range(8)
E_DDR, E_LINK, E_HELD, E_NONE, E_FILL, E_DRAIN, E_STARVED = range(7)
# -- event log kinds -------------------------------------------------------------------------
EV_LOAD, EV_TRANSFER, EV_COMPUTE = 0, 1, 2
DISPATCH = 0
#: :func:`run`'s result when the layer reached a state in which nothing can happen any more
STALLED = -1


@njit(cache=True)
def ring_after(traj, c, n):
    """``fsedp.params._ring_after``."""
    for s in range(1, n + 1):
        m = c + s
        if m >= n:
            m -= n
        if (traj >> m) & 1:
            return m
    return -1


@njit(cache=True)
def popcount(x):
    k = 0
    while x:
        k += x & 1
        x >>= 1
    return k


@njit(cache=True)
def path_hops(traj, start, n, DIST):
    """``DatapathParams.path_hops``."""
    total = 0
    c = start
    for _ in range(popcount(traj) - 1):
        nxt = ring_after(traj, c, n)
        total += DIST[c, nxt]
        c = nxt
    return total


@njit(cache=True)
def route_tables(traj, n, DIST, hops, rdest, rhops):
    """Per chiplet ``a``: ``path_hops(traj, a)`` and ``remote_entry(traj, a)``."""
    for a in range(n):
        hops[a] = path_hops(traj, a, n, DIST) if (traj >> a) & 1 else 0
    for a in range(n):
        best, bj = -1, -1
        for j in range(n):
            if (traj >> j) & 1:
                cost = DIST[a, j] + hops[j]
                if best < 0 or cost < best:
                    best, bj = cost, j
        rdest[a], rhops[a] = bj, best


@njit(cache=True)
def present(SL, c, i):
    return (
        SL[c, i, S_BUSY] != 0
        and SL[c, i, S_RESV] == 0
        and SL[c, i, S_WAIT] == 0
        and SL[c, i, S_HELD] == 0
    )


@njit(cache=True)
def releasable(SL, c, i):
    """``Slot.releasable`` (Rule 3)."""
    return (
        present(SL, c, i)
        and SL[c, i, S_COMP] == 0
        and SL[c, i, S_COMPUTING] == 0
        and SL[c, i, S_SEND] == 0
        and SL[c, i, S_TX] == 0
    )


@njit(cache=True)
def store(SL, P, DIRT, c, slot, expert, index, traj, dest, legs, r, wait, ddr, held):
    """``ring_buffer.store`` with ``arrive``."""
    n = P[P_N]
    SL[c, slot, S_BUSY] = 1
    SL[c, slot, S_RESV] = 0
    SL[c, slot, S_WAIT] = wait
    SL[c, slot, S_HELD] = held
    SL[c, slot, S_DDR] = ddr
    SL[c, slot, S_COMPUTING] = 0
    SL[c, slot, S_TX] = 0
    SL[c, slot, S_REM] = 0
    SL[c, slot, S_R] = r
    SL[c, slot, S_EXPERT] = expert
    SL[c, slot, S_INDEX] = index
    SL[c, slot, S_TRAJ] = traj
    if dest == c:
        if legs:
            nxt = ring_after(traj, c, n)
            SL[c, slot, S_COMP] = 1
            SL[c, slot, S_SEND] = 1
            SL[c, slot, S_FINAL] = 0
            SL[c, slot, S_DEST] = nxt
            SL[c, slot, S_LEGS] = legs - 1
            SL[c, slot, S_DIR] = DIRT[c, nxt]
        else:
            SL[c, slot, S_COMP] = 1
            SL[c, slot, S_SEND] = 0
            SL[c, slot, S_FINAL] = 1
            SL[c, slot, S_DEST] = c
            SL[c, slot, S_LEGS] = 0
            SL[c, slot, S_DIR] = 0
    else:
        SL[c, slot, S_COMP] = 0
        SL[c, slot, S_SEND] = 1
        SL[c, slot, S_FINAL] = 0
        SL[c, slot, S_DEST] = dest
        SL[c, slot, S_LEGS] = legs
        SL[c, slot, S_DIR] = DIRT[c, dest]


@njit(cache=True)
def within_window(P, JB, TK, j, extra):
    """``ddr.within_window`` ([D12])."""
    if P[P_HOT] == 0 or JB[j, J_LOADED] + extra - JB[j, J_RETIRED] < P[P_HOT]:
        return True
    t = 0
    traj = JB[j, J_TRAJ]
    for c in range(P[P_N]):
        if (traj >> c) & 1 and TK[c, JB[j, J_EXPERT]] > t:
            t = TK[c, JB[j, J_EXPERT]]
    return max(1, t) * P[P_CPT] <= P[P_DINT]


@njit(cache=True)
def channel_ok(P, GP, FQ, used, ddr_stall, target):
    ch = target if P[P_CHAN] > 1 else 0
    return used[ch] == 0 and GP[ch] == 0 and not ddr_stall and FQ[ch, 1] < P[P_FDEPTH]


@njit(cache=True)
def need(P, JH, j, a):
    """``ddr.need`` for job ``j``."""
    return JH[j, a] if P[P_ADMIT] else 0


@njit(cache=True)
def step(S, beat, ddr_stall, st, ws):
    """``StreamingArray.step`` with probes and the simulator's bookkeeping of one cycle:
    ``S`` the state (:data:`STATE`), ``beat`` ``(has, kind, expert, entry, traj)``, ``st``
    the per-cycle outputs (see :func:`run`), ``ws`` scratch arrays allocated once per run.
    Returns ``(horizon, done)``: the cycles a skip may jump (0 after an active cycle, -1 when
    nothing is counting either: ``StreamingArray.stuck``) and the ``done`` mask shown."""
    P, NB, DIRT, DIST, SL, CH, JB, JH, JRD, JRR, PR, QH, QRD, FF, FQ, GP, TK, MS, SC = S
    n, K = P[P_N], P[P_K]
    chans = P[P_CHAN]
    W, OFF, ISS, REL, HX = ws
    free = W[0, :n]
    for c in range(n):
        f = 0
        for i in range(K):
            if SL[c, i, S_BUSY] == 0:
                f += 1
        free[c] = f

    # 1-2. router offers and accepts ----------------------------------------------------------
    offer = OFF
    offer[:] = -1
    for c in range(n):
        best_r = W[1, :4]
        for i in range(K):
            if SL[c, i, S_SEND] and present(SL, c, i) and SL[c, i, S_TX] == 0:
                d = SL[c, i, S_DIR]
                if offer[c, d] < 0 or SL[c, i, S_R] < best_r[d]:
                    offer[c, d] = i
                    best_r[d] = SL[c, i, S_R]
        for d in range(4):
            if offer[c, d] >= 0 and (NB[c, d] < 0 or CH[c, C_LB + d] != 0):
                offer[c, d] = -1
    acc_d = W[2, :n]  # input direction, -1: none
    acc_d[:] = -1
    acc_src, acc_s, acc_slot = W[3, :n], W[4, :n], W[5, :n]
    for c in range(n):
        for k in range(4):
            d = (CH[c, C_RR] + k) & 3
            src = NB[c, d]
            if src < 0:
                continue
            s = offer[src, (d + 2) & 3]
            if s < 0:
                continue
            r = SL[src, s, S_R] - 1
            if (r if P[P_ADMIT] else 0) < free[c]:
                slot = 0
                while SL[c, slot, S_BUSY] != 0:
                    slot += 1
                acc_d[c], acc_src[c], acc_s[c], acc_slot[c] = d, src, s, slot
                break
    free2 = W[6, :n]
    free2[:] = free
    for c in range(n):
        if acc_d[c] >= 0:
            free2[c] -= 1

    # 3. DDR issue --------------------------------------------------------------------------
    used = W[7, :chans]
    used[:] = 0
    # issues: kind (0 job, 1 pre), index, target, expert, traj, micro-slice, dest
    iss = ISS
    ni = 0
    extra = W[8, :n]
    extra[:] = 0
    npre = P[P_NPRE]
    pre_extra = W[9, : max(1, npre)]
    pre_extra[:] = 0
    if chans > 1 and not P[P_RULE5]:
        idle_channel = W[10, :n]
        nidle = 0
        for c in range(n):
            if not channel_ok(P, GP, FQ, used, ddr_stall, c):
                continue
            found = False
            for k in range(n):
                j = SC[X_DDR_RR] + k
                if j >= n:
                    j -= n
                if (
                    JB[j, J_VALID]
                    and (JB[j, J_TRAJ] >> c) & 1
                    and JB[j, J_LOADED] + extra[j] < JB[j, J_COUNT]
                    and free2[c] > need(P, JH, j, c)
                    and within_window(P, JB, TK, j, extra[j])
                ):
                    iss[ni, 0], iss[ni, 1], iss[ni, 2] = 0, j, c
                    iss[ni, 3], iss[ni, 4] = JB[j, J_EXPERT], JB[j, J_TRAJ]
                    iss[ni, 5], iss[ni, 6] = JB[j, J_LOADED] + extra[j], c
                    ni += 1
                    extra[j] += 1
                    used[c] = 1
                    free2[c] -= 1
                    found = True
                    break
            if not found:
                idle_channel[nidle] = c
                nidle += 1
    else:
        for k in range(n):
            j = SC[X_DDR_RR] + k
            if j >= n:
                j -= n
            if (
                not JB[j, J_VALID]
                or JB[j, J_LOADED] >= JB[j, J_COUNT]
                or not within_window(P, JB, TK, j, 0)
            ):
                continue
            # ddr_target: Rule 4 striping, or Rule 5's emptiest chiplet
            target = -1
            if not P[P_RULE5]:
                t = JB[j, J_TARGET]
                if channel_ok(P, GP, FQ, used, ddr_stall, t) and free2[t] > need(P, JH, j, t):
                    target = t
            else:
                for a in range(n):
                    if (
                        (JB[j, J_TRAJ] >> a) & 1
                        and channel_ok(P, GP, FQ, used, ddr_stall, a)
                        and free2[a] > need(P, JH, j, a)
                    ):
                        if target < 0 or free2[a] > free2[target]:
                            target = a
            if target >= 0:
                iss[ni, 0], iss[ni, 1], iss[ni, 2] = 0, j, target
                iss[ni, 3], iss[ni, 4] = JB[j, J_EXPERT], JB[j, J_TRAJ]
                iss[ni, 5], iss[ni, 6] = JB[j, J_LOADED], target
                ni += 1
                used[target if chans > 1 else 0] = 1
                free2[target] -= 1
    H = P[P_H]
    if chans > 1:
        for c in range(n):
            if not channel_ok(P, GP, FQ, used, ddr_stall, c) or free2[c] <= H + 1:
                continue
            for k in range(npre):
                if (
                    PR[k, Q_VALID]
                    and (PR[k, Q_TRAJ] >> c) & 1
                    and PR[k, Q_LOADED] + pre_extra[k] < PR[k, Q_COUNT]
                ):
                    iss[ni, 0], iss[ni, 1], iss[ni, 2] = 1, k, c
                    iss[ni, 3], iss[ni, 4] = PR[k, Q_EXPERT], PR[k, Q_TRAJ]
                    iss[ni, 5], iss[ni, 6] = PR[k, Q_LOADED] + pre_extra[k], c
                    ni += 1
                    pre_extra[k] += 1
                    used[c] = 1
                    free2[c] -= 1
                    break
        if not P[P_RULE5] and P[P_ADMIT]:
            for x in range(nidle):
                c = idle_channel[x]
                if not channel_ok(P, GP, FQ, used, ddr_stall, c):
                    continue
                found = False
                for k in range(n):
                    j = SC[X_DDR_RR] + k
                    if j >= n:
                        j -= n
                    if not JB[j, J_VALID] or JB[j, J_LOADED] + extra[j] >= JB[j, J_COUNT]:
                        continue
                    if not within_window(P, JB, TK, j, extra[j]):
                        continue
                    dest, r = JRD[j, c], JRR[j, c]
                    if free2[c] > r:
                        iss[ni, 0], iss[ni, 1], iss[ni, 2] = 0, j, c
                        iss[ni, 3], iss[ni, 4] = JB[j, J_EXPERT], JB[j, J_TRAJ]
                        iss[ni, 5], iss[ni, 6] = JB[j, J_LOADED] + extra[j], dest
                        ni += 1
                        extra[j] += 1
                        used[c] = 1
                        free2[c] -= 1
                        found = True
                        break
                if not found:
                    if free2[c] <= H + 1:
                        continue
                    for k in range(npre):
                        if not PR[k, Q_VALID] or PR[k, Q_LOADED] + pre_extra[k] >= PR[k, Q_COUNT]:
                            continue
                        dest = QRD[k, c]
                        iss[ni, 0], iss[ni, 1], iss[ni, 2] = 1, k, c
                        iss[ni, 3], iss[ni, 4] = PR[k, Q_EXPERT], PR[k, Q_TRAJ]
                        iss[ni, 5], iss[ni, 6] = PR[k, Q_LOADED] + pre_extra[k], dest
                        ni += 1
                        pre_extra[k] += 1
                        used[c] = 1
                        free2[c] -= 1
                        break
    else:
        for k in range(npre):
            q = PR[k, Q_CHIPLET]
            if (
                PR[k, Q_VALID]
                and PR[k, Q_LOADED] < PR[k, Q_COUNT]
                and channel_ok(P, GP, FQ, used, ddr_stall, q)
                and free2[q] > H + 1
            ):
                iss[ni, 0], iss[ni, 1], iss[ni, 2] = 1, k, q
                iss[ni, 3], iss[ni, 4] = PR[k, Q_EXPERT], PR[k, Q_TRAJ]
                iss[ni, 5], iss[ni, 6] = PR[k, Q_LOADED], q
                ni += 1
                used[0] = 1
                free2[q] -= 1
    # headers of the issued loads: reserved slot (the highest free one), legs, hops
    iss_slot, iss_legs, iss_r = W[11], W[12], W[13]
    for x in range(ni):
        t = iss[x, 2]
        slot = K - 1
        while SL[t, slot, S_BUSY] != 0:
            slot -= 1
        iss_slot[x] = slot
        traj, dest = iss[x, 4], iss[x, 6]
        iss_legs[x] = popcount(traj) - 1
        hops = JH[iss[x, 1], dest] if iss[x, 0] == 0 else QH[iss[x, 1], dest]
        iss_r[x] = hops + DIST[t, dest]

    # 4. DDR deliveries -----------------------------------------------------------------------
    dispatch_e = beat[2] if beat[0] and beat[1] == DISPATCH else -1
    dlv = W[14, :chans]  # 1: the queue's head is delivered
    dlv_held = W[15, :chans]
    dlv[:] = 0
    dlv_held[:] = 0
    age_mod = np.int64(1) << P[P_AGE]
    for ch in range(chans):
        if FQ[ch, 1] and not ddr_stall:
            h = FQ[ch, 0]
            if (SC[X_NOW] - FF[ch, h, F_TS]) & (age_mod - 1) >= P[P_DLAT]:
                held = FF[ch, h, F_HELD]
                if held:
                    e = FF[ch, h, F_EXPERT]
                    for j in range(n):
                        if JB[j, J_VALID] and JB[j, J_EXPERT] == e:
                            held = 0
                    if dispatch_e == e:
                        held = 0
                dlv[ch] = 1
                dlv_held[ch] = held

    # 5. compute --------------------------------------------------------------------------
    ev = W[16, :n]  # 1: a computation ends here this cycle
    ev[:] = 0
    start = W[17, :n]
    start[:] = -1
    start_cycles = W[18, :n]
    cpt = P[P_CPT]
    for c in range(n):
        cnt = CH[c, C_CNT]
        if cnt == 1:
            ev[c] = 1
        if cnt > 1 and P[P_PREEMPT]:
            best, bd = -1, 0
            for i in range(K):
                if present(SL, c, i) and SL[c, i, S_COMP]:
                    d = SL[c, i, S_REM]
                    if d == 0:
                        d = max(1, TK[c, SL[c, i, S_EXPERT]]) * cpt
                    if d < cnt - 1 and (best < 0 or d < bd):
                        best, bd = i, d
            if best >= 0:
                start[c], start_cycles[c] = best, bd
            continue
        if cnt <= 1:
            pick, first = -1, -1
            for i in range(K):
                if present(SL, c, i) and SL[c, i, S_COMP]:
                    if first < 0:
                        first = i
                    if SL[c, i, S_DDR] == 0:
                        pick = i
                        break
            if pick < 0:
                pick = first
            if pick >= 0:
                start[c] = pick
                d = SL[c, pick, S_REM]
                if d == 0:
                    d = max(1, TK[c, SL[c, pick, S_EXPERT]]) * cpt
                start_cycles[c] = d
    # 6. retire
    retired = W[19, :n]
    retired[:] = 0
    for c in range(n):
        if ev[c] and CH[c, C_CFINAL]:
            e = CH[c, C_CEXPERT]
            jj = -1
            for j in range(n):
                if JB[j, J_VALID] and JB[j, J_EXPERT] == e:
                    jj = j
                    break
            if jj < 0:
                SC[X_ORPHAN] = 1
            else:
                retired[jj] += 1
    done_out = SC[X_DONE]

    # -- probes (registered state, before the clock edge) ----------------------------------------
    ddr_why = st[0]
    pe_why = st[1]
    issued_job = W[20, :n]
    issued_job[:] = 0
    issued_pre = W[21, : max(1, npre)]
    issued_pre[:] = 0
    for x in range(ni):
        if iss[x, 0] == 0:
            issued_job[iss[x, 1]] += 1
        else:
            issued_pre[iss[x, 1]] += 1
    n_left = 0
    n_jobs = 0
    for j in range(n):
        if JB[j, J_VALID] and JB[j, J_LOADED] + issued_job[j] < JB[j, J_COUNT]:
            n_left += 1
            if within_window(P, JB, TK, j, issued_job[j]):
                n_jobs += 1
    n_pres = 0
    for k in range(npre):
        if PR[k, Q_VALID] and PR[k, Q_LOADED] + issued_pre[k] < PR[k, Q_COUNT]:
            n_pres += 1
    for ch in range(chans):
        if used[ch] or GP[ch]:
            ddr_why[ch] = -1
        elif ddr_stall or FQ[ch, 1] >= P[P_FDEPTH]:
            ddr_why[ch] = D_STALL
        elif n_jobs == 0 and n_pres == 0:
            ddr_why[ch] = D_WINDOW if n_left else D_NONE
        elif chans > 1:
            if free2[ch] == 0:
                ddr_why[ch] = D_FULL
            else:
                ddr_why[ch] = D_ADMISSION if n_jobs else D_PRELOAD
        else:
            all_full = True
            if n_jobs:
                for j in range(n):
                    if (
                        JB[j, J_VALID]
                        and JB[j, J_LOADED] + issued_job[j] < JB[j, J_COUNT]
                        and within_window(P, JB, TK, j, issued_job[j])
                        and free2[JB[j, J_TARGET]] != 0
                    ):
                        all_full = False
            else:
                for k in range(npre):
                    if (
                        PR[k, Q_VALID]
                        and PR[k, Q_LOADED] + issued_pre[k] < PR[k, Q_COUNT]
                        and free2[PR[k, Q_CHIPLET]] != 0
                    ):
                        all_full = False
            if all_full:
                ddr_why[ch] = D_FULL
            else:
                ddr_why[ch] = D_ADMISSION if n_jobs else D_PRELOAD
    for c in range(n):
        if CH[c, C_CNT]:
            pe_why[c] = -1
            continue
        if start[c] >= 0:
            pe_why[c] = E_DDR if SL[c, start[c], S_DDR] else E_LINK
            continue
        reason = E_NONE
        for i in range(K):
            if SL[c, i, S_BUSY] and SL[c, i, S_HELD]:
                reason = E_HELD
            elif SL[c, i, S_BUSY] and (SL[c, i, S_RESV] or SL[c, i, S_WAIT]):
                reason = E_DDR if (SL[c, i, S_RESV] or SL[c, i, S_DDR]) else E_LINK
                break
        if reason == E_NONE:
            for d in range(4):
                src = NB[c, d]
                if src < 0:
                    continue
                hit = False
                for i in range(K):
                    if (
                        SL[src, i, S_BUSY]
                        and SL[src, i, S_SEND]
                        and SL[src, i, S_TX] == 0
                        and NB[src, SL[src, i, S_DIR]] == c
                    ):
                        hit = True
                        break
                if hit:
                    reason = E_LINK
                    break
        pe_why[c] = reason

    # Rule 3 on the registered state
    rel = REL
    rel[:] = 0
    any_rel = False
    for c in range(n):
        for i in range(K):
            if releasable(SL, c, i):
                rel[c, i] = 1
                any_rel = True
    any_acc = False
    for c in range(n):
        if acc_d[c] >= 0:
            any_acc = True
    any_dlv = False
    for ch in range(chans):
        if dlv[ch]:
            any_dlv = True
    any_start = False
    any_ev = False
    for c in range(n):
        if start[c] >= 0:
            any_start = True
        if ev[c]:
            any_ev = True
    active = (
        any_acc
        or ni > 0
        or any_dlv
        or any_start
        or any_ev
        or done_out != 0
        or beat[0] != 0
        or any_rel
    )
    # cycles until a counter can change a decision, on the registered state; -1 when none
    # is counting: nothing but counters changed and none will, a fixed point without inputs
    # (``StreamingArray.stuck``, the progress watchdog of ``fsedp.sw.streaming.watchdog``)
    hz = 0
    if not active:
        hz = horizon(P, SL, CH, FF, FQ, GP, SC)
        if hz == 0:
            hz = -1

    # -- bookkeeping of the cycle (the simulator's) ------------------------------------------
    cycle = SC[X_CYCLE]
    occ = st[2]
    for c in range(n):
        occ[c] = K - free[c]
    log = P[P_LOG]
    EVL = st[3]
    for c in range(n):
        if acc_d[c] >= 0:
            src, s = acc_src[c], acc_s[c]
            SC[X_TRANSFERS] += 1
            st[4][src, (acc_d[c] + 2) & 3] += 1
            if log:
                m = SC[X_NEV]
                EVL[m, 0], EVL[m, 1], EVL[m, 2] = EV_TRANSFER, cycle, src
                EVL[m, 3] = (acc_d[c] + 2) & 3
                EVL[m, 4], EVL[m, 5] = SL[src, s, S_EXPERT], SL[src, s, S_INDEX]
                SC[X_NEV] = m + 1
    for x in range(ni):
        SC[X_LOADS] += 1
        st[5][iss[x, 2]] += 1
        if log:
            m = SC[X_NEV]
            EVL[m, 0], EVL[m, 1], EVL[m, 2] = EV_LOAD, cycle, iss[x, 2]
            EVL[m, 3], EVL[m, 4], EVL[m, 5] = iss_slot[x], iss[x, 3], iss[x, 5]
            SC[X_NEV] = m + 1

    # ---- next state -------------------------------------------------------------------------
    # ring buffers: release, counters
    for c in range(n):
        for i in range(K):
            if rel[c, i]:
                SL[c, i, S_BUSY] = 0
            if SL[c, i, S_WAIT]:
                SL[c, i, S_WAIT] -= 1
            if SL[c, i, S_TX]:
                SL[c, i, S_TX] -= 1
        for d in range(4):
            if CH[c, C_LB + d] > 0:
                CH[c, C_LB + d] -= 1
    # routers: transfers (headers read before any store of this cycle)
    L = P[P_LINK]
    hx = HX
    for c in range(n):
        if acc_d[c] >= 0:
            src, s = acc_src[c], acc_s[c]
            hx[c, 0], hx[c, 1], hx[c, 2] = (
                SL[src, s, S_EXPERT],
                SL[src, s, S_INDEX],
                SL[src, s, S_TRAJ],
            )
            hx[c, 3], hx[c, 4], hx[c, 5] = (
                SL[src, s, S_DEST],
                SL[src, s, S_LEGS],
                SL[src, s, S_R] - 1,
            )
    for c in range(n):
        if acc_d[c] < 0:
            continue
        d, src, s, slot = acc_d[c], acc_src[c], acc_s[c], acc_slot[c]
        SL[src, s, S_SEND] = 0
        SL[src, s, S_TX] = L - 1
        CH[src, C_LB + ((d + 2) & 3)] = L - 1
        CH[c, C_RR] = (d + 1) & 3
        store(
            SL,
            P,
            DIRT,
            c,
            slot,
            hx[c, 0],
            hx[c, 1],
            hx[c, 2],
            hx[c, 3],
            hx[c, 4],
            hx[c, 5],
            L - 1,
            0,
            0,
        )
    # DDR: deliveries, issues, gaps
    fdepth = P[P_FDEPTH]
    for ch in range(chans):
        if dlv[ch]:
            h = FQ[ch, 0]
            store(
                SL,
                P,
                DIRT,
                FF[ch, h, F_TARGET],
                FF[ch, h, F_SLOT],
                FF[ch, h, F_EXPERT],
                FF[ch, h, F_INDEX],
                FF[ch, h, F_TRAJ],
                FF[ch, h, F_DEST],
                FF[ch, h, F_LEGS],
                FF[ch, h, F_R],
                0,
                1,
                dlv_held[ch],
            )
            FQ[ch, 0] = h + 1 if h + 1 < fdepth else 0
            FQ[ch, 1] -= 1
    for x in range(ni):
        t = iss[x, 2]
        ch = t if chans > 1 else 0
        slot = iss_slot[x]
        SL[t, slot, S_BUSY] = 1
        SL[t, slot, S_RESV] = 1
        q = FQ[ch, 0] + FQ[ch, 1]
        if q >= fdepth:
            q -= fdepth
        FF[ch, q, F_TARGET], FF[ch, q, F_SLOT] = t, slot
        FF[ch, q, F_EXPERT], FF[ch, q, F_INDEX], FF[ch, q, F_TRAJ] = iss[x, 3], iss[x, 5], iss[x, 4]
        FF[ch, q, F_DEST], FF[ch, q, F_LEGS], FF[ch, q, F_R] = iss[x, 6], iss_legs[x], iss_r[x]
        FF[ch, q, F_HELD] = iss[x, 0]
        FF[ch, q, F_TS] = SC[X_NOW]
        FQ[ch, 1] += 1
        if iss[x, 0] == 0:
            j = iss[x, 1]
            JB[j, J_LOADED] += 1
            JB[j, J_TARGET] = ring_after(JB[j, J_TRAJ], t, n)
            SC[X_DDR_RR] = j + 1 if j + 1 < n else 0
        else:
            PR[iss[x, 1], Q_LOADED] += 1
    for ch in range(chans):
        if used[ch]:
            GP[ch] = P[P_DINT] - 1
        elif GP[ch]:
            GP[ch] -= 1
    # compute
    for c in range(n):
        if CH[c, C_CNT] == 1:
            SL[c, CH[c, C_CSLOT], S_COMPUTING] = 0
        if start[c] >= 0 and CH[c, C_CNT] > 1:  # preempted: resumes with what is left
            cur = CH[c, C_CSLOT]
            SL[c, cur, S_COMPUTING] = 0
            SL[c, cur, S_COMP] = 1
            SL[c, cur, S_REM] = CH[c, C_CNT] - 1
    # completion events of the cycle (the unit's registers before a start replaces them)
    for c in range(n):
        st[6][c] = ev[c]
        if ev[c]:
            SC[X_COMPUTATIONS] += 1
            if log:
                m = SC[X_NEV]
                EVL[m, 0], EVL[m, 1], EVL[m, 2] = EV_COMPUTE, cycle, c
                EVL[m, 3], EVL[m, 4], EVL[m, 5] = CH[c, C_CFINAL], CH[c, C_CEXPERT], CH[c, C_CINDEX]
                SC[X_NEV] = m + 1
    ev_expert = W[22, :n]
    for c in range(n):
        ev_expert[c] = CH[c, C_CEXPERT]
    for c in range(n):
        if start[c] >= 0:
            i = start[c]
            SL[c, i, S_REM] = 0
            SL[c, i, S_COMP] = 0
            SL[c, i, S_COMPUTING] = 1
            CH[c, C_CNT] = start_cycles[c]
            CH[c, C_CSLOT] = i
            CH[c, C_CEXPERT] = SL[c, i, S_EXPERT]
            CH[c, C_CINDEX] = SL[c, i, S_INDEX]
            CH[c, C_CFINAL] = SL[c, i, S_FINAL]
        elif CH[c, C_CNT]:
            CH[c, C_CNT] -= 1
    # dispatch beat (sees the jobs as registered)
    if beat[0]:
        take_dispatch(P, DIST, DIRT, SL, JB, JH, JRD, JRR, PR, QH, QRD, MS, SC, beat, W[23, :n])
    # jobs retire
    done_new = 0
    for j in range(n):
        if retired[j]:
            JB[j, J_RETIRED] += retired[j]
            if JB[j, J_RETIRED] >= JB[j, J_COUNT]:
                JB[j, J_VALID] = 0
                done_new |= 1 << j
    SC[X_DONE] = (0 if done_out != 0 else SC[X_DONE]) | done_new
    SC[X_NOW] = (SC[X_NOW] + 1) & (age_mod - 1)
    SC[X_CYCLE] += 1
    # busy cycles of the computations that ended (tokens as after the clock edge)
    busy = st[7]
    for c in range(n):
        if ev[c]:
            busy[c] += max(1, TK[c, ev_expert[c]]) * cpt
    return hz, done_out


#: ``Slot.held`` of a micro-slice loaded ahead of its layer (``ddr.AHEAD``)
AHEAD = 2


@njit(cache=True)
def bind_ahead(P, DIRT, SL, expert, traj, held, hops, rdest, rhops):
    """``ddr.bind_ahead`` with the trajectory's route tables; returns the count bound."""
    n, K = P[P_N], P[P_K]
    legs = popcount(traj) - 1
    got = 0
    for c in range(n):
        for i in range(K):
            if SL[c, i, S_BUSY] and SL[c, i, S_HELD] == AHEAD and SL[c, i, S_EXPERT] == expert:
                if (traj >> c) & 1:
                    dest, r = c, hops[c]
                else:
                    dest, r = rdest[c], rhops[c]
                store(SL, P, DIRT, c, i, expert, SL[c, i, S_INDEX], traj, dest, legs, r, 0, 1, held)
                got += 1
    return got


@njit(cache=True)
def take_dispatch(P, DIST, DIRT, SL, JB, JH, JRD, JRR, PR, QH, QRD, MS, SC, beat, tmp):
    """``ddr.take_dispatch``."""
    n, K = P[P_N], P[P_K]
    kind, expert, entry, traj = beat[1], beat[2], beat[3], beat[4]
    if (
        traj == 0
        or traj >> n
        or not 0 <= entry < n
        or not (traj >> entry) & 1
        or not (0 <= expert < P[P_E])
    ):
        SC[X_BAD] = 1
        return
    if kind != DISPATCH:
        for k in range(P[P_NPRE]):
            if not PR[k, Q_VALID]:
                route_tables(traj, n, DIST, QH[k], QRD[k], tmp)
                got = bind_ahead(P, DIRT, SL, expert, traj, 1, QH[k], QRD[k], tmp)
                PR[k, Q_VALID], PR[k, Q_EXPERT], PR[k, Q_TRAJ] = 1, expert, traj
                PR[k, Q_CHIPLET], PR[k, Q_LOADED], PR[k, Q_COUNT] = entry, got, MS[expert]
                break
        return
    if JB[entry, J_VALID]:
        SC[X_BAD] = 1
        return
    route_tables(traj, n, DIST, JH[entry], JRD[entry], JRR[entry])
    loaded = bind_ahead(P, DIRT, SL, expert, traj, 0, JH[entry], JRD[entry], JRR[entry])
    count = MS[expert]
    for k in range(P[P_NPRE]):
        if PR[k, Q_VALID] and PR[k, Q_EXPERT] == expert:
            loaded, count = PR[k, Q_LOADED], PR[k, Q_COUNT]
            PR[k, Q_VALID] = 0
            for c in range(n):  # its chiplet, or any with a channel each or ones loaded ahead
                for i in range(K):
                    if SL[c, i, S_BUSY] and SL[c, i, S_HELD] and SL[c, i, S_EXPERT] == expert:
                        SL[c, i, S_HELD] = 0
            break
    JB[entry, J_VALID], JB[entry, J_EXPERT], JB[entry, J_TRAJ] = 1, expert, traj
    JB[entry, J_LOADED], JB[entry, J_RETIRED], JB[entry, J_TARGET] = loaded, 0, entry
    JB[entry, J_COUNT] = count


@njit(cache=True)
def horizon(P, SL, CH, FF, FQ, GP, SC):
    """``StreamingArray._counters_horizon``."""
    n, K = P[P_N], P[P_K]
    h = -1
    for c in range(n):
        for i in range(K):
            w = SL[c, i, S_WAIT]
            if w and (h < 0 or w < h):
                h = w
            t = SL[c, i, S_TX]
            if t and (h < 0 or t < h):
                h = t
        for d in range(4):
            b = CH[c, C_LB + d]
            if b and (h < 0 or b < h):
                h = b
        if CH[c, C_CNT] > 1 and (h < 0 or CH[c, C_CNT] - 1 < h):
            h = CH[c, C_CNT] - 1
    for ch in range(P[P_CHAN]):
        g = GP[ch]
        if g and (h < 0 or g < h):
            h = g
        if FQ[ch, 1]:
            age = (SC[X_NOW] - FF[ch, FQ[ch, 0], F_TS]) & ((np.int64(1) << P[P_AGE]) - 1)
            if age < P[P_DLAT]:
                v = P[P_DLAT] - age
                if h < 0 or v < h:
                    h = v
    return h if h > 0 else 0


@njit(cache=True)
def fast_forward(P, SL, CH, GP, SC, k):
    """``StreamingArray.fast_forward`` by ``k`` cycles."""
    n, K = P[P_N], P[P_K]
    for c in range(n):
        for i in range(K):
            if SL[c, i, S_WAIT]:
                SL[c, i, S_WAIT] -= k
            if SL[c, i, S_TX]:
                SL[c, i, S_TX] -= k
        for d in range(4):
            if CH[c, C_LB + d]:
                CH[c, C_LB + d] -= k
        if CH[c, C_CNT]:
            CH[c, C_CNT] -= k
    for ch in range(P[P_CHAN]):
        if GP[ch]:
            GP[ch] -= k
    SC[X_NOW] = (SC[X_NOW] + k) & ((np.int64(1) << P[P_AGE]) - 1)
    SC[X_CYCLE] += k


@njit(cache=True)
def idle(P, SL, CH, JB, PR, FQ, SC):
    """``StreamingArray.idle``."""
    for c in range(P[P_N]):
        if CH[c, C_CNT]:
            return False
        for i in range(P[P_K]):
            if SL[c, i, S_BUSY]:
                return False
        if JB[c, J_VALID]:
            return False
    for k in range(P[P_NPRE]):
        if PR[k, Q_VALID]:
            return False
    for ch in range(P[P_CHAN]):
        if FQ[ch, 1]:
            return False
    return SC[X_DONE] == 0


@njit(cache=True)
def count_why(P, ddr_why, pe_why, more, started, computed, expected, DI, PI, DW, PW, weight):
    """The simulator's idle causes (``_ddr_cause``, ``_pe_cause``) of one cycle, counted with
    ``weight``; ``DW``/``PW`` keep them for the cycles a skip repeats."""
    for ch in range(P[P_CHAN]):
        w = ddr_why[ch]
        if w == D_NONE:
            w = D_DISPATCH if more else D_DRAIN
        DW[ch] = w
        if w >= 0:
            DI[w] += weight
    for c in range(P[P_N]):
        w = pe_why[c]
        if w >= 0:
            if not started[c]:
                w = E_FILL
            elif computed[c] >= expected[c]:
                w = E_DRAIN
            elif w == E_NONE:
                w = E_STARVED
        PW[c] = w
        if w >= 0:
            PI[w] += weight


@njit(cache=True)
def recount(P, DI, PI, DW, PW, weight):
    for ch in range(P[P_CHAN]):
        if DW[ch] >= 0:
            DI[DW[ch]] += weight
    for c in range(P[P_N]):
        if PW[c] >= 0:
            PI[PW[c]] += weight


@njit(cache=True)
def run(S, B, BT, nbeats, in_round, plan_n):
    """Run the layer's cycles until a job finishes (returns its done mask, the scheduler is
    asked for more beats), the layer ends (returns 0) or nothing can happen any more (returns
    :data:`STALLED`, the state as it is: ``fsedp.sw.streaming.watchdog``, the same cycle as
    the Python loop's).  ``BT[b] = (kind, expert, entry,
    traj)`` are the beats to present, one per cycle from ``SC[X_BPOS]`` on; ``S`` is the
    state (:data:`STATE`), ``B`` the layer's bookkeeping (:data:`BOOKS`)."""
    P, NB, DIRT, DIST, SL, CH, JB, JH, JRD, JRR, PR, QH, QRD, FF, FQ, GP, TK, MS, SC = S
    DI, PI, DW, PW, started, computed, expected, peak, links, ddr_per, busy, TL, EVL = B
    n = P[P_N]
    ddr_why = np.zeros(P[P_CHAN], np.int64)
    pe_why = np.zeros(n, np.int64)
    occ = np.zeros(n, np.int64)
    ended = np.zeros(n, np.int64)
    beat = np.zeros(5, np.int64)
    st = (ddr_why, pe_why, occ, EVL, links, ddr_per, ended, busy)
    width = max(2 * n + 2, P[P_CHAN], P[P_NPRE], 4)
    ws = (
        np.zeros((24, width), np.int64),
        np.zeros((n, 4), np.int64),
        np.zeros((2 * n + 2, 7), np.int64),
        np.zeros((n, P[P_K]), np.int64),
        np.zeros((n, 6), np.int64),
    )
    # a skip that was due when the last call returned for the scheduler
    if SC[X_FF] > 1 and SC[X_BPOS] >= nbeats:
        k = SC[X_FF] - 1
        fast_forward(P, SL, CH, GP, SC, k)
        recount(P, DI, PI, DW, PW, k)
    SC[X_FF] = 0
    while in_round or SC[X_BPOS] < nbeats or not idle(P, SL, CH, JB, PR, FQ, SC):
        SC[X_STEPS] += 1
        cycle = SC[X_CYCLE]
        b = SC[X_BPOS]
        if b < nbeats:
            beat[0], beat[1], beat[2], beat[3], beat[4] = 1, BT[b, 0], BT[b, 1], BT[b, 2], BT[b, 3]
        else:
            beat[0] = 0
        h, done = step(S, beat, False, st, ws)
        if beat[0]:
            SC[X_BPOS] = b + 1
            if beat[1] == DISPATCH:
                SC[X_DISPATCHED] += 1
        more = SC[X_DISPATCHED] < plan_n
        # the causes see the counts from before this cycle's completions
        count_why(P, ddr_why, pe_why, more, started, computed, expected, DI, PI, DW, PW, 1)
        for c in range(n):
            if CH[c, C_CNT] > 0:
                started[c] = 1
            computed[c] += ended[c]
        for c in range(n):
            if occ[c] > peak[c]:
                peak[c] = occ[c]
        computing = 0
        for c in range(n):
            if CH[c, C_CNT] > 0:
                computing += 1
        m = SC[X_NTL]
        if computing != TL[m - 1, 1]:
            TL[m, 0], TL[m, 1] = cycle + 1, computing
            SC[X_NTL] = m + 1
        if done:
            SC[X_FF] = h
            return done
        if h < 0 and SC[X_BPOS] >= nbeats and (in_round or not idle(P, SL, CH, JB, PR, FQ, SC)):
            return STALLED  # the progress watchdog: every further cycle is this one again
        if SC[X_BPOS] >= nbeats and h > 1:
            fast_forward(P, SL, CH, GP, SC, h - 1)
            recount(P, DI, PI, DW, PW, h - 1)
    return 0


@njit(cache=True)
def flow_shop(load, comp, slots, latency, start, begin, end, issue, issue_end):
    """``fsedp.sim.baselines._flow_shop`` on arrays: returns the makespan and fills the
    compute (``begin``, ``end``) and load (``issue``, ``issue_end``) intervals."""
    issue_free = 0
    prev = start
    for k in range(len(load)):
        slot_free = end[k - slots] if k >= slots else 0
        iss = max(issue_free, slot_free)
        issue_free = iss + load[k]
        issue[k] = iss
        issue_end[k] = issue_free
        b = max(iss + load[k] + latency, prev)
        prev = b + comp[k]
        begin[k] = b
        end[k] = prev
    return prev
