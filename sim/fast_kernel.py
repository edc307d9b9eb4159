"""The compiled interpretation of the streaming golden model (numba): the cycle loop of one
FSE-DP layer, :class:`fsedp.sw.streaming.StreamingArray` transliterated onto integer arrays,
with the simulator's per-cycle bookkeeping (``fsedp.sim.fsedp``) and exact event skipping.

This module is the kernel only; :mod:`fsedp.sim.fast` drives it (the scheduler golden model
stays in Python and is called when a job finishes).  It is shaped like the golden model:
one function per golden function, named after it (``router_accept`` is
``fsedp.sw.streaming.router.accept``, ``ddr_issue`` is ``ddr.issue``, ``step`` is
``StreamingArray.step``), whose docstring opens with the counterpart's name;
``docs/architecture.md`` lists them side by side with the RTL and the testbenches.  A change
to a rule there is made in the function of the same name here, and ``tests/test_fast.py``
compares the two engines event for event (and checks that every counterpart named exists).

Nothing here restates a constant of the golden model: the columns of the state arrays are
the fields of its dataclasses (:class:`~fsedp.sw.streaming.ring_buffer.Slot`,
:class:`~fsedp.sw.streaming.ddr.Job`, :class:`~fsedp.sw.streaming.ddr.Preload`,
:class:`~fsedp.sw.streaming.array.Chiplet`, the DDR queue entry ``(target, slot, Header,
held, issued)``), the idle causes index :data:`fsedp.sw.streaming.probe.DDR_CAUSES` and
``PE_CAUSES``, beat kinds are :class:`fsedp.params.BeatKind`, link directions
:data:`fsedp.params.OPPOSITE`, and :func:`ring_after` is :func:`fsedp.params.ring_after`
compiled.  numba reads module-level integers and tuples as compile-time constants, so
deriving them costs nothing at run time.

State arrays (int64):

* ``SL[c, i, f]`` slot ``i`` of chiplet ``c``, field ``f`` (``S_*``);
* ``CH[c, f]`` chiplet fields (``C_*``), ``JB[j, f]`` jobs (``J_*``), ``PR[k, f]`` pre-loads
  (``Q_*``); ``JH[j, a]`` path hops of job ``j``'s trajectory from ``a``, ``JRD``/``JRR`` its
  remote entry (dest, hops) from ``a``; ``QH``/``QRD`` the same for pre-loads;
* ``FF[ch, q, f]`` the DDR delivery queues (``F_*``) with ``FQ[ch, 0]`` head and
  ``FQ[ch, 1]`` length; ``GP[ch]`` the channels' gaps; ``TK[c, e]`` the token tables;
  ``MS[e]`` the slice table (micro-slices expert ``e`` streams, [D13]);
* ``SC[f]`` scalars (``X_*``); ``P[f]`` the parameters (``P_*``).

They travel as two tuples, in the orders :data:`STATE` and :data:`BOOKS` name.  One cycle's
decisions (the golden ``step``'s local variables) live in the rows ``W_*`` of one scratch
matrix ``W``, allocated once per run.
"""

from dataclasses import fields

import numpy as np
from numba import njit

from fsedp.params import OPPOSITE, BeatKind
from fsedp.params import ring_after as _ring_after
from fsedp.sim.fast import Event
from fsedp.sw.streaming.array import Chiplet
from fsedp.sw.streaming.ddr import AHEAD, Job, Preload
from fsedp.sw.streaming.probe import DDR_CAUSES, PE_CAUSES
from fsedp.sw.streaming.ring_buffer import Header, Slot

#: the state tuple ``S`` of :func:`step` and :func:`run`
STATE = ("P", "NB", "DIRT", "DIST", "SL", "CH", "JB", "JH", "JRD", "JRR", "PR", "QH", "QRD")
STATE += ("FF", "FQ", "GP", "TK", "MS", "RO", "SC", "RG")
#: the bookkeeping tuple ``B`` of :func:`run`
BOOKS = ("DI", "PI", "DW", "PW", "started", "computed", "expected", "peak", "links")
BOOKS += ("ddr_per", "busy", "TL", "EVL")


def columns(cls, *names, first: int = 0, widths: dict | None = None) -> tuple:
    """Column indices of the fields ``names`` of dataclass ``cls`` laid out one after the
    other from ``first`` (``widths``: fields that take several columns); every field must be
    named, so a field added to the golden model fails here, at import, until the kernel
    stores it."""
    have = [f.name for f in fields(cls)]
    if sorted(names) != sorted(have):
        raise TypeError(f"{cls.__name__} has the fields {have}; the kernel lays out {names}")
    out, col = [], first
    for name in names:
        out.append(col)
        col += (widths or {}).get(name, 1)
    return (*out, col)


#: positions in the state tuple: ``S[AT_SL]`` is ``SL`` (a function takes the arrays it reads)
(
    AT_P, AT_NB, AT_DIRT, AT_DIST, AT_SL, AT_CH, AT_JB, AT_JH, AT_JRD, AT_JRR, AT_PR, AT_QH,
    AT_QRD, AT_FF, AT_FQ, AT_GP, AT_TK, AT_MS, AT_RO, AT_SC, AT_RG,
) = (
    STATE.index(x)
    for x in (
        "P", "NB", "DIRT", "DIST", "SL", "CH", "JB", "JH", "JRD", "JRR", "PR", "QH",
        "QRD", "FF", "FQ", "GP", "TK", "MS", "RO", "SC", "RG",
    )
)  # fmt: skip
# -- parameters ---------------------------------------------------------------------------
P_N, P_K, P_E, P_M, P_CPT, P_LINK, P_DINT, P_DLAT = 0, 1, 2, 3, 4, 5, 6, 7
P_NPRE, P_RULE5, P_CHAN, P_PREEMPT, P_HOT, P_ADMIT, P_AGE, P_FDEPTH = 8, 9, 10, 11, 12, 13, 14, 15
P_H, P_LOG, P_COLS, P_ORDERS = 16, 17, 18, 19
NP = P_ORDERS + 1
# -- slot fields: ring_buffer.Slot ------------------------------------------------------------
(
    S_BUSY, S_RESV, S_WAIT, S_HELD, S_COMP, S_COMPUTING, S_SEND, S_TX, S_DDR,
    S_FINAL, S_REM, S_DIR, S_R, S_EXPERT, S_INDEX, S_TRAJ, S_DEST, S_LEGS, S_CLAIM, NS,
) = columns(
    Slot, "busy", "resv", "wait", "held", "comp", "computing", "send", "tx", "ddr",
    "final", "rem", "dir", "r", "expert", "index", "traj", "dest", "legs", "claim",
)  # fmt: skip
#: ``P[P_ADMIT]``: ``DatapathParams.admission`` (``fsedp.params.ADMISSION_RULES``)
ADMIT_COUNT, ADMIT_STATE = 1, 2
# -- chiplet fields: array.Chiplet (its slots are SL; link_busy takes four columns) ----------
C_RR, C_CNT, C_CSLOT, C_CEXPERT, C_CINDEX, C_CFINAL, C_LB, _C_SLOTS, NC = columns(
    Chiplet,
    "rr",
    "cnt",
    "cslot",
    "cexpert",
    "cindex",
    "cfinal",
    "link_busy",
    "slots",
    widths={"link_busy": 4, "slots": 0},
)
# -- jobs and pre-loads: ddr.Job, ddr.Preload ----------------------------------------------
J_VALID, J_EXPERT, J_TRAJ, J_LOADED, J_RETIRED, J_TARGET, J_COUNT, NJ = columns(
    Job, "valid", "expert", "traj", "loaded", "retired", "target", "count"
)
Q_VALID, Q_EXPERT, Q_TRAJ, Q_CHIPLET, Q_LOADED, Q_COUNT, NQ = columns(
    Preload, "valid", "expert", "traj", "chiplet", "loaded", "count"
)
# -- DDR queue entries: (target, slot, Header, held, issued) as ddr.commit queues them --------
F_TARGET, F_SLOT = 0, 1
F_EXPERT, F_INDEX, F_TRAJ, F_DEST, F_LEGS, F_R, F_HELD = columns(
    Header, "expert", "index", "traj", "dest", "legs", "r", first=2
)
F_TS = F_HELD + 1
NF = F_TS + 1
# -- scalars --------------------------------------------------------------------------------
X_DDR_RR, X_NOW, X_CYCLE, X_DONE, X_BAD, X_ORPHAN, X_STEPS, X_FF = 0, 1, 2, 3, 4, 5, 6, 7
X_LOADS, X_TRANSFERS, X_COMPUTATIONS, X_DISPATCHED, X_NEV, X_NTL, X_BPOS = range(8, 15)
NX = X_BPOS + 1
# -- idle causes: indices into probe.DDR_CAUSES and probe.PE_CAUSES ---------------------------
D_STALL, D_FULL, D_ADMISSION, D_PRELOAD, D_WINDOW, D_NONE, D_DISPATCH, D_DRAIN = (
    DDR_CAUSES.index(x)
    for x in ("stall", "full", "admission", "preload", "window", "none", "dispatch", "drain")
)
E_DDR, E_LINK, E_HELD, E_NONE, E_FILL, E_DRAIN, E_STARVED = (
    PE_CAUSES.index(x) for x in ("ddr", "link", "held", "none", "fill", "drain", "starved")
)
# -- event log kinds: fsedp.sim.fast.Event ---------------------------------------------------
EV_LOAD, EV_TRANSFER, EV_COMPUTE = int(Event.LOAD), int(Event.TRANSFER), int(Event.COMPUTE)
DISPATCH = int(BeatKind.DISPATCH)
#: output link ``d`` feeds input ``OPPOSITE[d]`` of the neighbour (``fsedp.params.OPPOSITE``)
OPP = np.array(OPPOSITE, np.int64)
#: :func:`run`'s status: the layer ended; a job finished (its mask beside it); the layer
#: reached a state in which nothing can happen any more
ENDED, DONE, STALLED = 0, 1, 2

# -- one cycle's decisions: rows of the scratch matrix W (the golden step's locals) ----------
W_FREE, W_BEST_R, W_ACC_D, W_ACC_SRC, W_ACC_S, W_ACC_SLOT, W_FREE2, W_USED = range(8)
W_EXTRA, W_PRE_EXTRA, W_IDLE_CH, W_ISS_SLOT, W_ISS_LEGS, W_ISS_R, W_DLV, W_DLV_HELD = range(8, 16)
W_EV, W_START, W_START_CYCLES, W_RETIRED, W_ISSUED_JOB, W_ISSUED_PRE, W_TMP = range(16, 23)
#: ``ddr.per_chiplet``'s picks per chiplet (stage, job or entry, destination, claim) and the
#: quotas per job and pre-load entry
W_PK_STAGE, W_PK_X, W_PK_DEST, W_PK_R, W_QUOTA, W_PQUOTA = range(23, 29)
NW = W_PQUOTA + 1
#: ``ddr.per_chiplet``'s pick stages (``W[W_PK_STAGE]``; -1: no pick)
PK_JOB, PK_PRE, PK_RJOB, PK_RPRE = range(4)
#: columns of an issued load (``ISS``): kind (0 job, 1 pre-load), job or entry index, target,
#: expert, trajectory, micro-slice, destination -- ``ddr.issue``'s tuples
I_KIND, I_IDX, I_TARGET, I_EXPERT, I_TRAJ, I_INDEX, I_DEST = range(7)
NI = I_DEST + 1

#: ``fsedp.params.ring_after``, the same function compiled
ring_after = njit(cache=True)(_ring_after)
#: A function of one cycle, mirroring one of the golden model's: numba inlines it into
#: :func:`step`, so that following the golden model's shape costs no calls.
in_step = njit(cache=True, inline="always")


@njit(cache=True)
def popcount(x):
    """``int.bit_count`` (the golden model's ``bin(traj).count("1")``): the chiplets of a
    trajectory.  Clears the lowest set bit until none is left, so that a 64-chiplet mask,
    negative as an ``int64`` (bit 63 set), is counted too (a shift right would never end)."""
    k = 0
    while x:
        x &= x - 1
        k += 1
    return k


@njit(cache=True)
def path_hops(traj, start, n, RG, DIST, order):
    """``DatapathParams.path_hops`` (``RG[order]``: the embedding's ``seq`` and ``pos``,
    ``DatapathParams.ring_table``)."""
    total = 0
    c = start
    for _ in range(popcount(traj) - 1):
        nxt = ring_after(traj, c, n, RG[order, 0], RG[order, 1])
        total += DIST[c, nxt]
        c = nxt
    return total


@njit(cache=True)
def route_tables(traj, order, n, RG, DIST, hops, rdest, rhops):
    """``DatapathParams.path_hops`` and ``DatapathParams.remote_entry`` of ``traj`` in ring
    embedding ``order`` from every chiplet ``a``, tabled once per job or pre-load."""
    for a in range(n):
        hops[a] = path_hops(traj, a, n, RG, DIST, order) if (traj >> a) & 1 else 0
    for a in range(n):
        best, bj = -1, -1
        for j in range(n):
            if (traj >> j) & 1:
                cost = DIST[a, j] + hops[j]
                if best < 0 or cost < best:
                    best, bj = cost, j
        rdest[a], rhops[a] = bj, best


# -- ring buffer (fsedp.sw.streaming.ring_buffer) ---------------------------------------------
@in_step
def slot_present(SL, c, i):
    """``Slot.present``."""
    return (
        SL[c, i, S_BUSY] != 0
        and SL[c, i, S_RESV] == 0
        and SL[c, i, S_WAIT] == 0
        and SL[c, i, S_HELD] == 0
    )


@in_step
def slot_releasable(SL, c, i):
    """``Slot.releasable`` (Rule 3)."""
    return (
        slot_present(SL, c, i)
        and SL[c, i, S_COMP] == 0
        and SL[c, i, S_COMPUTING] == 0
        and SL[c, i, S_SEND] == 0
        and SL[c, i, S_TX] == 0
    )


@in_step
def ring_buffer_free_slots(SL, c, K):
    """``ring_buffer.free_slots``."""
    f = 0
    for i in range(K):
        if SL[c, i, S_BUSY] == 0:
            f += 1
    return f


@in_step
def room_open(P, SL, W, CLM):
    """``ring_buffer.Room``: the free slots of the registered state (``W[W_FREE]``, and
    ``W[W_FREE2]`` which admissions take) and, under forward-state admission, each
    chiplet's slots by the hops they claim (``CLM[c, r]``)."""
    n, K = P[P_N], P[P_K]
    for c in range(n):
        W[W_FREE, c] = ring_buffer_free_slots(SL, c, K)
        W[W_FREE2, c] = W[W_FREE, c]
        if P[P_ADMIT] == ADMIT_STATE:
            CLM[c, :] = 0
            for i in range(K):
                if SL[c, i, S_BUSY]:
                    CLM[c, SL[c, i, S_CLAIM]] += 1


@in_step
def room_admits(P, W, CLM, c, r):
    """``ring_buffer.Room.admits``."""
    if P[P_ADMIT] == ADMIT_STATE:
        return room_fits(P, CLM, c, r, 1)
    return W[W_FREE2, c] > r


@in_step
def room_fits(P, CLM, c, r, new):
    """``ring_buffer.Room.fits``."""
    above = 0
    for i in range(P[P_H] + 1, -1, -1):
        above += CLM[c, i]
        if i <= r and above + new + i > P[P_K]:
            return False
    return True


@in_step
def room_admits_load(P, W, CLM, c, r):
    """``ring_buffer.Room.admits_load`` ([D20])."""
    if not room_admits(P, W, CLM, c, r):
        return False
    return P[P_ADMIT] != ADMIT_STATE or room_fits(P, CLM, c, min(r, P[P_H] - 1), 2)


@in_step
def room_take(P, W, CLM, c, r):
    """``ring_buffer.Room.take``."""
    W[W_FREE2, c] -= 1
    if P[P_ADMIT] == ADMIT_STATE:
        CLM[c, r] += 1


@in_step
def ring_buffer_store(
    SL, P, DIRT, RO, RG, c, slot, expert, index, traj, dest, legs, r, wait, ddr, held
):
    """``ring_buffer.store`` with ``ring_buffer.arrive`` (``RO``: each expert's ring
    embedding, ``StreamingArray.ring_order``; ``RG``: the embeddings' tables)."""
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
    SL[c, slot, S_CLAIM] = P[P_H] + 1 if held else r
    SL[c, slot, S_EXPERT] = expert
    SL[c, slot, S_INDEX] = index
    SL[c, slot, S_TRAJ] = traj
    if dest == c:  # a station: compute here, then the next ring leg
        if legs:
            nxt = ring_after(traj, c, n, RG[RO[expert], 0], RG[RO[expert], 1])
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


@in_step
def releasable_slots(S, REL):
    """``Slot.releasable`` of every slot (``StreamingArray.step``'s ``release``): Rule 3 on
    the registered state; whether any slot is released."""
    P, SL = S[AT_P], S[AT_SL]
    any_rel = False
    for c in range(P[P_N]):
        for i in range(P[P_K]):
            r = slot_releasable(SL, c, i)
            REL[c, i] = r
            any_rel |= r
    return any_rel


@in_step
def ring_buffer_tick(S, REL):
    """``ring_buffer.tick``."""
    P, SL, CH = S[AT_P], S[AT_SL], S[AT_CH]
    for c in range(P[P_N]):
        for i in range(P[P_K]):
            if REL[c, i]:
                SL[c, i, S_BUSY] = 0
            if SL[c, i, S_WAIT]:
                SL[c, i, S_WAIT] -= 1
            if SL[c, i, S_TX]:
                SL[c, i, S_TX] -= 1
        for d in range(4):
            if CH[c, C_LB + d] > 0:
                CH[c, C_LB + d] -= 1


# -- router (fsedp.sw.streaming.router) -------------------------------------------------------
@in_step
def router_offers(S, OFF, best_r, c):
    """``router.offers``: ``OFF[c, d]`` the slot offered on output ``d`` (-1: none)."""
    P, NB, SL, CH = S[AT_P], S[AT_NB], S[AT_SL], S[AT_CH]
    OFF[c, :] = -1
    for i in range(P[P_K]):
        if SL[c, i, S_SEND] and slot_present(SL, c, i) and SL[c, i, S_TX] == 0:
            d = SL[c, i, S_DIR]
            if OFF[c, d] < 0 or SL[c, i, S_R] < best_r[d]:
                OFF[c, d] = i
                best_r[d] = SL[c, i, S_R]
    for d in range(4):
        if OFF[c, d] >= 0 and (NB[c, d] < 0 or CH[c, C_LB + d] != 0):
            OFF[c, d] = -1


@in_step
def router_accept(S, W, OFF, CLM):
    """``router.accept``: per chiplet ``c`` the accepted input direction ``W[W_ACC_D, c]``
    (-1: none), its source chiplet and slot and the slot it lands in; the ledger
    (``W[W_FREE2]``, ``CLM``: ``ring_buffer.Room`` less this cycle's DDR loads) takes each."""
    P, NB, SL, CH = S[AT_P], S[AT_NB], S[AT_SL], S[AT_CH]
    n = P[P_N]
    for c in range(n):
        router_offers(S, OFF, W[W_BEST_R], c)
    acc_d, acc_src, acc_s, acc_slot = W[W_ACC_D], W[W_ACC_SRC], W[W_ACC_S], W[W_ACC_SLOT]
    for c in range(n):
        acc_d[c] = -1
        for k in range(4):
            d = (CH[c, C_RR] + k) & 3
            src = NB[c, d]
            if src < 0:
                continue
            s = OFF[src, OPP[d]]
            if s < 0:
                continue
            r = SL[src, s, S_R] - 1
            if room_admits(P, W, CLM, c, r):
                slot = 0
                while SL[c, slot, S_BUSY] != 0:
                    slot += 1
                acc_d[c], acc_src[c], acc_s[c], acc_slot[c] = d, src, s, slot
                room_take(P, W, CLM, c, r)
                break


@in_step
def router_commit(S, W, HX):
    """``router.commit``: the accepted transfers (headers read before any store)."""
    P, SL, CH = S[AT_P], S[AT_SL], S[AT_CH]
    n, L = P[P_N], P[P_LINK]
    acc_d, acc_src, acc_s, acc_slot = W[W_ACC_D], W[W_ACC_SRC], W[W_ACC_S], W[W_ACC_SLOT]
    for c in range(n):
        if acc_d[c] >= 0:
            src, s = acc_src[c], acc_s[c]
            h = HX[c]  # the Header on the link, in the DDR queue entry's columns
            h[F_EXPERT], h[F_INDEX], h[F_TRAJ] = (
                SL[src, s, S_EXPERT],
                SL[src, s, S_INDEX],
                SL[src, s, S_TRAJ],
            )
            h[F_DEST], h[F_LEGS], h[F_R] = (
                SL[src, s, S_DEST],
                SL[src, s, S_LEGS],
                SL[src, s, S_R] - 1,
            )
    for c in range(n):
        if acc_d[c] < 0:
            continue
        d, src, s = acc_d[c], acc_src[c], acc_s[c]
        SL[src, s, S_SEND] = 0
        SL[src, s, S_TX] = L - 1
        CH[src, C_LB + OPP[d]] = L - 1
        CH[c, C_RR] = (d + 1) & 3
        h = HX[c]
        ring_buffer_store(
            SL, P, S[AT_DIRT], S[AT_RO], S[AT_RG], c, acc_slot[c], h[F_EXPERT], h[F_INDEX],
            h[F_TRAJ], h[F_DEST], h[F_LEGS], h[F_R], L - 1, 0, 0,
        )  # fmt: skip


# -- DDR controller (fsedp.sw.streaming.ddr) --------------------------------------------------
@in_step
def ddr_within_window(P, JB, TK, j, extra):
    """``ddr.within_window`` ([D12])."""
    if P[P_HOT] == 0 or JB[j, J_LOADED] + extra - JB[j, J_RETIRED] < P[P_HOT]:
        return True
    t = 0
    traj = JB[j, J_TRAJ]
    for c in range(P[P_N]):
        if (traj >> c) & 1 and TK[c, JB[j, J_EXPERT]] > t:
            t = TK[c, JB[j, J_EXPERT]]
    return max(1, t) * P[P_CPT] <= P[P_DINT]


@in_step
def channel_ok(P, GP, FQ, used, ddr_stall, target):
    """``ddr.issue``'s ``channel_ok``."""
    ch = target if P[P_CHAN] > 1 else 0
    return used[ch] == 0 and GP[ch] == 0 and not ddr_stall and FQ[ch, 1] < P[P_FDEPTH]


@in_step
def ddr_need(P, JH, j, a):
    """``ddr.need`` for job ``j``."""
    return JH[j, a] if P[P_ADMIT] else 0


@in_step
def ddr_target(S, W, CLM, j, ddr_stall):
    """``ddr.ddr_target`` (-1: none)."""
    P, JB, JH, FQ, GP = S[AT_P], S[AT_JB], S[AT_JH], S[AT_FQ], S[AT_GP]
    free2, used = W[W_FREE2], W[W_USED]
    if not P[P_RULE5]:
        t = JB[j, J_TARGET]
        if channel_ok(P, GP, FQ, used, ddr_stall, t) and room_admits_load(
            P, W, CLM, t, ddr_need(P, JH, j, t)
        ):
            return t
        return -1
    best = -1
    for a in range(P[P_N]):
        if (
            (JB[j, J_TRAJ] >> a) & 1
            and channel_ok(P, GP, FQ, used, ddr_stall, a)
            and room_admits_load(P, W, CLM, a, ddr_need(P, JH, j, a))
        ):
            if best < 0 or free2[a] > free2[best]:
                best = a
    return best


@in_step
def _issue_job(ISS, ni, JB, j, target, extra, dest):
    """``ddr.issue``'s ``("job", ...)`` tuple: job ``j``'s next micro-slice (after
    ``extra`` issued this cycle) into ``target``, for ``dest``; returns ``ni + 1``."""
    ISS[ni, I_KIND], ISS[ni, I_IDX], ISS[ni, I_TARGET], ISS[ni, I_DEST] = 0, j, target, dest
    ISS[ni, I_EXPERT], ISS[ni, I_TRAJ] = JB[j, J_EXPERT], JB[j, J_TRAJ]
    ISS[ni, I_INDEX] = JB[j, J_LOADED] + extra
    return ni + 1


@in_step
def _issue_pre(ISS, ni, PR, k, target, extra, dest):
    """``ddr.issue``'s ``("pre", ...)`` tuple (pre-load entry ``k``)."""
    ISS[ni, I_KIND], ISS[ni, I_IDX], ISS[ni, I_TARGET], ISS[ni, I_DEST] = 1, k, target, dest
    ISS[ni, I_EXPERT], ISS[ni, I_TRAJ] = PR[k, Q_EXPERT], PR[k, Q_TRAJ]
    ISS[ni, I_INDEX] = PR[k, Q_LOADED] + extra
    return ni + 1


@in_step
def ddr_window_quota(P, JB, TK, j):
    """``ddr.window_quota``."""
    left = JB[j, J_COUNT] - JB[j, J_LOADED]
    if P[P_HOT] == 0 or ddr_within_window(P, JB, TK, j, P[P_HOT] + JB[j, J_COUNT]):
        return left
    return max(0, min(left, P[P_HOT] - (JB[j, J_LOADED] - JB[j, J_RETIRED])))


@in_step
def ddr_per_chiplet(S, W, ISS, CLM, ddr_stall):
    """``ddr.per_chiplet``: the chiplets' picks from the cycle's starting state, then the
    grants up to each job's and pre-load entry's quota.  Returns ``ni``."""
    P, JB, JH, JRD = S[AT_P], S[AT_JB], S[AT_JH], S[AT_JRD]
    JRR, PR, QRD = S[AT_JRR], S[AT_PR], S[AT_QRD]
    FQ, GP, TK, SC = S[AT_FQ], S[AT_GP], S[AT_TK], S[AT_SC]
    n, npre, H = P[P_N], P[P_NPRE], P[P_H]
    used, taken, ptaken = W[W_USED], W[W_EXTRA], W[W_PRE_EXTRA]
    stage, px, pdest, pr = W[W_PK_STAGE], W[W_PK_X], W[W_PK_DEST], W[W_PK_R]
    quota, pquota = W[W_QUOTA], W[W_PQUOTA]
    for j in range(n):
        quota[j] = ddr_window_quota(P, JB, TK, j) if JB[j, J_VALID] else 0
    for k in range(npre):
        pquota[k] = PR[k, Q_COUNT] - PR[k, Q_LOADED] if PR[k, Q_VALID] else 0
    for c in range(n):
        stage[c] = -1
        if not channel_ok(P, GP, FQ, used, ddr_stall, c):
            continue
        for k in range(n):
            j = SC[X_DDR_RR] + k
            if j >= n:
                j -= n
            if quota[j] > 0 and (JB[j, J_TRAJ] >> c) & 1:
                r = ddr_need(P, JH, j, c)
                if room_admits_load(P, W, CLM, c, r):
                    stage[c], px[c], pdest[c], pr[c] = PK_JOB, j, c, r
                    break
        if stage[c] >= 0:
            continue
        if room_admits_load(P, W, CLM, c, H + 1):
            for k in range(npre):
                if pquota[k] > 0 and (PR[k, Q_TRAJ] >> c) & 1:
                    stage[c], px[c], pdest[c], pr[c] = PK_PRE, k, c, H + 1
                    break
            if stage[c] >= 0:
                continue
        if not P[P_ADMIT]:
            continue
        for k in range(n):
            j = SC[X_DDR_RR] + k
            if j >= n:
                j -= n
            if quota[j] > 0 and room_admits_load(P, W, CLM, c, JRR[j, c]):  # remote [D10]
                stage[c], px[c], pdest[c], pr[c] = PK_RJOB, j, JRD[j, c], JRR[j, c]
                break
        if stage[c] >= 0 or not room_admits_load(P, W, CLM, c, H + 1):
            continue
        for k in range(npre):
            if pquota[k] > 0:
                stage[c], px[c], pdest[c], pr[c] = PK_RPRE, k, QRD[k, c], H + 1
                break
    taken[:n] = 0
    ptaken[: max(1, npre)] = 0
    ni = 0
    for phase in range(3):
        for c in range(n):
            g = stage[c]
            if g < 0 or (phase == 0 and g != PK_JOB) or (phase == 1 and g != PK_PRE):
                continue
            if phase == 2 and g != PK_RJOB and g != PK_RPRE:
                continue
            x = px[c]
            if g == PK_JOB or g == PK_RJOB:
                if taken[x] >= quota[x]:
                    continue
                ni = _issue_job(ISS, ni, JB, x, c, taken[x], pdest[c])
                taken[x] += 1
            else:
                if ptaken[x] >= pquota[x]:
                    continue
                ni = _issue_pre(ISS, ni, PR, x, c, ptaken[x], pdest[c])
                ptaken[x] += 1
            used[c] = 1
            room_take(P, W, CLM, c, pr[c])
    return ni


@in_step
def ddr_issue(S, W, ISS, CLM, ddr_stall):
    """``ddr.issue``: this cycle's loads ``ISS[:ni]`` (``I_*``) and their headers
    (``issue_out``: ``W[W_ISS_SLOT]``, ``W[W_ISS_LEGS]``, ``W[W_ISS_R]``); ``W[W_USED]``
    the channels used; the ledger (``W[W_FREE2]``, ``CLM``: ``ring_buffer.Room`` on the
    registered state) takes every load.  Returns ``ni``."""
    P, DIST, SL, JB, JH = S[AT_P], S[AT_DIST], S[AT_SL], S[AT_JB], S[AT_JH]
    PR, QH = S[AT_PR], S[AT_QH]
    FQ, GP, TK, SC = S[AT_FQ], S[AT_GP], S[AT_TK], S[AT_SC]
    n, K, chans, npre, H = P[P_N], P[P_K], P[P_CHAN], P[P_NPRE], P[P_H]
    used, pre_extra = W[W_USED], W[W_PRE_EXTRA]
    used[:chans] = 0
    pre_extra[: max(1, npre)] = 0
    ni = 0
    if chans > 1 and not P[P_RULE5]:
        ni = ddr_per_chiplet(S, W, ISS, CLM, ddr_stall)
    else:
        for k in range(n):
            j = SC[X_DDR_RR] + k
            if j >= n:
                j -= n
            if (
                not JB[j, J_VALID]
                or JB[j, J_LOADED] >= JB[j, J_COUNT]
                or not ddr_within_window(P, JB, TK, j, 0)
            ):
                continue
            target = ddr_target(S, W, CLM, j, ddr_stall)
            if target >= 0:
                ni = _issue_job(ISS, ni, JB, j, target, 0, target)
                used[target if chans > 1 else 0] = 1
                room_take(P, W, CLM, target, ddr_need(P, JH, j, target))
    if chans > 1 and P[P_RULE5]:
        # Rule 5: pre-loads go to any idle buffer of their trajectory
        for c in range(n):
            if not channel_ok(P, GP, FQ, used, ddr_stall, c) or not room_admits_load(
                P, W, CLM, c, H + 1
            ):
                continue
            for k in range(npre):
                if (
                    PR[k, Q_VALID]
                    and (PR[k, Q_TRAJ] >> c) & 1
                    and PR[k, Q_LOADED] + pre_extra[k] < PR[k, Q_COUNT]
                ):
                    ni = _issue_pre(ISS, ni, PR, k, c, pre_extra[k], c)
                    pre_extra[k] += 1
                    used[c] = 1
                    room_take(P, W, CLM, c, H + 1)
                    break
    elif chans == 1:
        for k in range(npre):
            q = PR[k, Q_CHIPLET]
            if (
                PR[k, Q_VALID]
                and PR[k, Q_LOADED] < PR[k, Q_COUNT]
                and channel_ok(P, GP, FQ, used, ddr_stall, q)
                and room_admits_load(P, W, CLM, q, H + 1)
            ):
                ni = _issue_pre(ISS, ni, PR, k, q, 0, q)
                used[0] = 1
                room_take(P, W, CLM, q, H + 1)
    # issue_out: the reserved slot (the highest free one), legs and hops of each load
    iss_slot, iss_legs, iss_r = W[W_ISS_SLOT], W[W_ISS_LEGS], W[W_ISS_R]
    for x in range(ni):
        t = ISS[x, I_TARGET]
        slot = K - 1
        while SL[t, slot, S_BUSY] != 0:
            slot -= 1
        iss_slot[x] = slot
        dest = ISS[x, I_DEST]
        iss_legs[x] = popcount(ISS[x, I_TRAJ]) - 1
        hops = JH[ISS[x, I_IDX], dest] if ISS[x, I_KIND] == 0 else QH[ISS[x, I_IDX], dest]
        iss_r[x] = hops + DIST[t, dest]
    return ni


@in_step
def ddr_deliveries(S, W, beat, ddr_stall):
    """``ddr.deliveries``: ``W[W_DLV, ch]`` whether channel ``ch``'s queue head is
    delivered, ``W[W_DLV_HELD, ch]`` whether it stays held."""
    P, JB, FF, FQ, SC = S[AT_P], S[AT_JB], S[AT_FF], S[AT_FQ], S[AT_SC]
    n = P[P_N]
    dispatch_e = beat[2] if beat[0] and beat[1] == DISPATCH else -1
    dlv, dlv_held = W[W_DLV], W[W_DLV_HELD]
    mask = (np.int64(1) << P[P_AGE]) - 1
    for ch in range(P[P_CHAN]):
        dlv[ch] = 0
        if FQ[ch, 1] and not ddr_stall:
            h = FQ[ch, 0]
            if (SC[X_NOW] - FF[ch, h, F_TS]) & mask >= P[P_DLAT]:
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


@in_step
def ddr_commit(S, W, ISS, ni):
    """``ddr.commit``: deliveries stored, issues reserved and queued, gaps counted."""
    P, SL, JB, PR, FF, FQ, GP = S[AT_P], S[AT_SL], S[AT_JB], S[AT_PR], S[AT_FF], S[AT_FQ], S[AT_GP]
    SC = S[AT_SC]
    n, chans, fdepth = P[P_N], P[P_CHAN], P[P_FDEPTH]
    dlv, dlv_held, used = W[W_DLV], W[W_DLV_HELD], W[W_USED]
    for ch in range(chans):
        if dlv[ch]:
            h = FQ[ch, 0]
            e = FF[ch, h]
            ring_buffer_store(
                SL, P, S[AT_DIRT], S[AT_RO], S[AT_RG], e[F_TARGET], e[F_SLOT], e[F_EXPERT],
                e[F_INDEX], e[F_TRAJ], e[F_DEST], e[F_LEGS], e[F_R], 0, 1, dlv_held[ch],
            )  # fmt: skip
            FQ[ch, 0] = h + 1 if h + 1 < fdepth else 0
            FQ[ch, 1] -= 1
    for x in range(ni):
        t = ISS[x, I_TARGET]
        ch = t if chans > 1 else 0
        slot = W[W_ISS_SLOT, x]
        SL[t, slot, S_BUSY] = 1
        SL[t, slot, S_RESV] = 1
        SL[t, slot, S_CLAIM] = P[P_H] + 1 if ISS[x, I_KIND] == 1 else W[W_ISS_R, x]
        q = FQ[ch, 0] + FQ[ch, 1]
        if q >= fdepth:
            q -= fdepth
        e = FF[ch, q]
        e[F_TARGET], e[F_SLOT] = t, slot
        e[F_EXPERT], e[F_INDEX], e[F_TRAJ] = ISS[x, I_EXPERT], ISS[x, I_INDEX], ISS[x, I_TRAJ]
        e[F_DEST], e[F_LEGS], e[F_R] = ISS[x, I_DEST], W[W_ISS_LEGS, x], W[W_ISS_R, x]
        e[F_HELD] = ISS[x, I_KIND]
        e[F_TS] = SC[X_NOW]
        FQ[ch, 1] += 1
        if ISS[x, I_KIND] == 0:
            j = ISS[x, I_IDX]
            JB[j, J_LOADED] += 1
            o = S[AT_RO][JB[j, J_EXPERT]]
            JB[j, J_TARGET] = ring_after(JB[j, J_TRAJ], t, n, S[AT_RG][o, 0], S[AT_RG][o, 1])
            SC[X_DDR_RR] = j + 1 if j + 1 < n else 0
        else:
            PR[ISS[x, I_IDX], Q_LOADED] += 1
    for ch in range(chans):
        if used[ch]:
            GP[ch] = P[P_DINT] - 1
        elif GP[ch]:
            GP[ch] -= 1


@in_step
def ddr_retire_jobs(S, W):
    """``ddr.retire_jobs``: the mask of entry slots whose job finished."""
    P, JB = S[AT_P], S[AT_JB]
    retired = W[W_RETIRED]
    done_new = 0
    for j in range(P[P_N]):
        if retired[j]:
            JB[j, J_RETIRED] += retired[j]
            if JB[j, J_RETIRED] >= JB[j, J_COUNT]:
                JB[j, J_VALID] = 0
                done_new |= 1 << j
    return done_new


@njit(cache=True)
def ddr_bind_ahead(P, DIRT, RO, RG, SL, expert, traj, held, hops, rdest, rhops):
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
                ring_buffer_store(
                    SL, P, DIRT, RO, RG, c, i, expert, SL[c, i, S_INDEX], traj, dest, legs, r, 0, 1,
                    held,
                )  # fmt: skip
                got += 1
    return got


@njit(cache=True)
def ddr_take_dispatch(S, beat, tmp):
    """``ddr.take_dispatch``."""
    P, DIRT, DIST, SL, JB, JH = S[AT_P], S[AT_DIRT], S[AT_DIST], S[AT_SL], S[AT_JB], S[AT_JH]
    JRD, JRR, PR, QH, QRD = S[AT_JRD], S[AT_JRR], S[AT_PR], S[AT_QH], S[AT_QRD]
    MS, RO, SC, RG = S[AT_MS], S[AT_RO], S[AT_SC], S[AT_RG]
    n, K = P[P_N], P[P_K]
    kind, expert, entry, traj, order = beat[1], beat[2], beat[3], beat[4], beat[5]
    if (
        traj == 0
        or (n < 64 and traj >> n)  # bits beyond the chiplets (a shift by 64 is undefined)
        or not 0 <= entry < n
        or not (traj >> entry) & 1
        or not (0 <= expert < P[P_E])
        or not (0 <= order < P[P_ORDERS])
    ):
        SC[X_BAD] = 1
        return
    if kind != DISPATCH:
        RO[expert] = order
        for k in range(P[P_NPRE]):
            if not PR[k, Q_VALID]:
                route_tables(traj, order, n, RG, DIST, QH[k], QRD[k], tmp)
                got = ddr_bind_ahead(P, DIRT, RO, RG, SL, expert, traj, 1, QH[k], QRD[k], tmp)
                PR[k, Q_VALID], PR[k, Q_EXPERT], PR[k, Q_TRAJ] = 1, expert, traj
                PR[k, Q_CHIPLET], PR[k, Q_LOADED], PR[k, Q_COUNT] = entry, got, MS[expert]
                break
        return
    if JB[entry, J_VALID]:
        SC[X_BAD] = 1
        return
    RO[expert] = order
    route_tables(traj, order, n, RG, DIST, JH[entry], JRD[entry], JRR[entry])
    loaded = ddr_bind_ahead(P, DIRT, RO, RG, SL, expert, traj, 0, JH[entry], JRD[entry], JRR[entry])
    count = MS[expert]
    for k in range(P[P_NPRE]):
        if PR[k, Q_VALID] and PR[k, Q_EXPERT] == expert:
            loaded, count = PR[k, Q_LOADED], PR[k, Q_COUNT]
            PR[k, Q_VALID] = 0
            for c in range(n):  # its chiplet, or any with a channel each or ones loaded ahead
                for i in range(K):
                    if SL[c, i, S_BUSY] and SL[c, i, S_HELD] and SL[c, i, S_EXPERT] == expert:
                        SL[c, i, S_HELD] = 0
                        SL[c, i, S_CLAIM] = SL[c, i, S_R]
            break
    JB[entry, J_VALID], JB[entry, J_EXPERT], JB[entry, J_TRAJ] = 1, expert, traj
    JB[entry, J_LOADED], JB[entry, J_RETIRED], JB[entry, J_TARGET] = loaded, 0, entry
    JB[entry, J_COUNT] = count


# -- compute unit (fsedp.sw.streaming.compute) ------------------------------------------------
@in_step
def compute_duration(P, SL, TK, c, i):
    """``compute.duration``."""
    d = SL[c, i, S_REM]
    return d if d else max(1, TK[c, SL[c, i, S_EXPERT]]) * P[P_CPT]


@in_step
def compute_decide(S, W):
    """``compute.decide``: ``W[W_EV, c]`` whether a computation ends on ``c`` this cycle,
    ``W[W_START, c]`` the slot that starts (-1: none) and ``W[W_START_CYCLES, c]`` its
    cycles."""
    P, SL, CH, TK = S[AT_P], S[AT_SL], S[AT_CH], S[AT_TK]
    K = P[P_K]
    ev, start, start_cycles = W[W_EV], W[W_START], W[W_START_CYCLES]
    for c in range(P[P_N]):
        cnt = CH[c, C_CNT]
        ev[c] = cnt == 1
        start[c] = -1
        if cnt > 1 and P[P_PREEMPT]:
            # [D11] the shortest present computation preempts a longer remainder
            best, bd = -1, 0
            for i in range(K):
                if slot_present(SL, c, i) and SL[c, i, S_COMP]:
                    d = compute_duration(P, SL, TK, c, i)
                    if d < cnt - 1 and (best < 0 or d < bd):
                        best, bd = i, d
            if best >= 0:
                start[c], start_cycles[c] = best, bd
            continue
        if cnt <= 1:
            pick, first = -1, -1
            for i in range(K):
                if slot_present(SL, c, i) and SL[c, i, S_COMP]:
                    if first < 0:
                        first = i
                    if SL[c, i, S_DDR] == 0:
                        pick = i
                        break
            if pick < 0:
                pick = first
            if pick >= 0:
                start[c], start_cycles[c] = pick, compute_duration(P, SL, TK, c, pick)


@in_step
def compute_retired(S, W):
    """``compute.retired``: ``W[W_RETIRED, j]`` micro-slices of job ``j`` retired."""
    P, JB, CH, SC = S[AT_P], S[AT_JB], S[AT_CH], S[AT_SC]
    n = P[P_N]
    retired, ev = W[W_RETIRED], W[W_EV]
    retired[:n] = 0
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


@in_step
def compute_commit(S, W):
    """``compute.commit``."""
    P, SL, CH = S[AT_P], S[AT_SL], S[AT_CH]
    start, start_cycles = W[W_START], W[W_START_CYCLES]
    for c in range(P[P_N]):
        if CH[c, C_CNT] == 1:
            SL[c, CH[c, C_CSLOT], S_COMPUTING] = 0
        if start[c] >= 0 and CH[c, C_CNT] > 1:  # preempted: resumes with what is left
            cur = CH[c, C_CSLOT]
            SL[c, cur, S_COMPUTING] = 0
            SL[c, cur, S_COMP] = 1
            SL[c, cur, S_REM] = CH[c, C_CNT] - 1
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


# -- probes (fsedp.sw.streaming.probe) --------------------------------------------------------
@in_step
def probe_ddr_idle(S, W, ISS, ni, ddr_stall, ddr_why):
    """``probe.ddr_idle``: ``ddr_why[ch]`` the cause index (``D_*``), -1 when busy."""
    P, JB, PR, FQ, GP, TK = S[AT_P], S[AT_JB], S[AT_PR], S[AT_FQ], S[AT_GP], S[AT_TK]
    n, npre, chans = P[P_N], P[P_NPRE], P[P_CHAN]
    free2, used = W[W_FREE2], W[W_USED]
    issued_job, issued_pre = W[W_ISSUED_JOB], W[W_ISSUED_PRE]
    issued_job[:n] = 0
    issued_pre[: max(1, npre)] = 0
    for x in range(ni):
        if ISS[x, I_KIND] == 0:
            issued_job[ISS[x, I_IDX]] += 1
        else:
            issued_pre[ISS[x, I_IDX]] += 1
    n_left = 0
    n_jobs = 0
    for j in range(n):
        if JB[j, J_VALID] and JB[j, J_LOADED] + issued_job[j] < JB[j, J_COUNT]:
            n_left += 1
            if ddr_within_window(P, JB, TK, j, issued_job[j]):
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
        elif chans > 1:  # chiplet-driven: the channel loads into its own chiplet
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
                        and ddr_within_window(P, JB, TK, j, issued_job[j])
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


@in_step
def probe_pe_idle(S, W, pe_why):
    """``probe.pe_idle``: ``pe_why[c]`` the cause index (``E_*``), -1 when computing."""
    P, NB, SL, CH = S[AT_P], S[AT_NB], S[AT_SL], S[AT_CH]
    K = P[P_K]
    start = W[W_START]
    for c in range(P[P_N]):
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
                for i in range(K):
                    if (
                        SL[src, i, S_BUSY]
                        and SL[src, i, S_SEND]
                        and SL[src, i, S_TX] == 0
                        and NB[src, SL[src, i, S_DIR]] == c
                    ):
                        reason = E_LINK
                        break
                if reason == E_LINK:
                    break
        pe_why[c] = reason


# -- the simulator's bookkeeping of a cycle (fsedp.sim.fsedp) ---------------------------------
@in_step
def book_decisions(S, W, ISS, ni, st):
    """``fsedp.sim.fsedp.fsedp_layer``'s bookkeeping of the cycle's decisions: occupancy,
    transfers and loads (with ``P_LOG`` their events: transfers, then loads, the order of
    ``fsedp.sim.fast.python_events``)."""
    P, SL, SC = S[AT_P], S[AT_SL], S[AT_SC]
    n, K, log = P[P_N], P[P_K], P[P_LOG]
    occ, EVL, links, ddr_per = st[2], st[3], st[4], st[5]
    cycle = SC[X_CYCLE]
    for c in range(n):
        occ[c] = K - W[W_FREE, c]
    for c in range(n):
        d = W[W_ACC_D, c]
        if d >= 0:
            src, s = W[W_ACC_SRC, c], W[W_ACC_S, c]
            SC[X_TRANSFERS] += 1
            links[src, OPP[d]] += 1
            if log:
                m = SC[X_NEV]
                EVL[m, 0], EVL[m, 1], EVL[m, 2], EVL[m, 3] = EV_TRANSFER, cycle, src, OPP[d]
                EVL[m, 4], EVL[m, 5] = SL[src, s, S_EXPERT], SL[src, s, S_INDEX]
                SC[X_NEV] = m + 1
    for x in range(ni):
        SC[X_LOADS] += 1
        ddr_per[ISS[x, I_TARGET]] += 1
        if log:
            m = SC[X_NEV]
            EVL[m, 0], EVL[m, 1], EVL[m, 2] = EV_LOAD, cycle, ISS[x, I_TARGET]
            EVL[m, 3], EVL[m, 4], EVL[m, 5] = W[W_ISS_SLOT, x], ISS[x, I_EXPERT], ISS[x, I_INDEX]
            SC[X_NEV] = m + 1


@in_step
def book_completions(S, W, st):
    """``fsedp.sim.fsedp.fsedp_layer``'s bookkeeping of the computations that end this cycle
    (the compute units' registers before a start replaces them): counted, logged and their
    busy cycles added."""
    P, CH, TK, SC = S[AT_P], S[AT_CH], S[AT_TK], S[AT_SC]
    EVL, ended, busy = st[3], st[6], st[7]
    ev = W[W_EV]
    cycle = SC[X_CYCLE]
    for c in range(P[P_N]):
        ended[c] = ev[c]
        if ev[c]:
            SC[X_COMPUTATIONS] += 1
            busy[c] += max(1, TK[c, CH[c, C_CEXPERT]]) * P[P_CPT]
            if P[P_LOG]:
                m = SC[X_NEV]
                EVL[m, 0], EVL[m, 1], EVL[m, 2] = EV_COMPUTE, cycle, c
                EVL[m, 3], EVL[m, 4], EVL[m, 5] = CH[c, C_CFINAL], CH[c, C_CEXPERT], CH[c, C_CINDEX]
                SC[X_NEV] = m + 1


# -- the chiplet array (fsedp.sw.streaming.array) ---------------------------------------------
# No reference counting in the cycle: ``step`` allocates nothing (numba refuses to compile an
# allocation without it), and counting the references of the array views that the inlined
# functions take cost a third of its time (fsedp bench).
@njit(cache=True, _nrt=False)
def step(S, beat, ddr_stall, ready, st, ws):
    """``StreamingArray.step`` with probes and the simulator's bookkeeping of one cycle:
    ``S`` the state (:data:`STATE`), ``beat`` ``(has, kind, expert, entry, traj, order)``,
    ``ready`` the scheduler's ``done.ready``, ``st`` the per-cycle outputs (see :func:`run`),
    ``ws`` scratch arrays allocated once per run.  Returns ``(horizon, done)``: the cycles a
    skip may jump (0 after an active cycle, -1 when nothing is counting either:
    ``StreamingArray.stuck``) and the ``done`` mask shown (taken only with ``ready``)."""
    P, SL, SC = S[AT_P], S[AT_SL], S[AT_SC]
    n, chans = P[P_N], P[P_CHAN]
    W, OFF, ISS, REL, HX, CLM = ws
    room_open(P, SL, W, CLM)

    # decisions: 1 router offers, 3 DDR issue, then 2 the routers' accepts in what the
    # loads leave ([D19]), 4 DDR delivery, 5 compute, 6 retirement
    ni = ddr_issue(S, W, ISS, CLM, ddr_stall)
    router_accept(S, W, OFF, CLM)
    ddr_deliveries(S, W, beat, ddr_stall)
    compute_decide(S, W)
    compute_retired(S, W)
    done_out = SC[X_DONE]
    probe_ddr_idle(S, W, ISS, ni, ddr_stall, st[0])
    probe_pe_idle(S, W, st[1])
    # Rule 3 on the registered state: evaluated once, used for activity and release
    any_rel = releasable_slots(S, REL)
    active = ni > 0 or done_out != 0 or beat[0] != 0 or any_rel
    for c in range(n):
        active |= W[W_ACC_D, c] >= 0 or W[W_START, c] >= 0 or W[W_EV, c] != 0
    for ch in range(chans):
        active |= W[W_DLV, ch] != 0
    # cycles until a counter can change a decision, on the registered state; -1 when none
    # is counting: nothing but counters changed and none will, a fixed point without inputs
    # (``StreamingArray.stuck``, the progress watchdog of ``fsedp.sw.streaming.watchdog``)
    hz = 0
    if not active:
        hz = counters_horizon(S)
        if hz == 0:
            hz = -1
    book_decisions(S, W, ISS, ni, st)
    book_completions(S, W, st)

    # ---- next state -------------------------------------------------------------------------
    ring_buffer_tick(S, REL)
    router_commit(S, W, HX)
    ddr_commit(S, W, ISS, ni)
    compute_commit(S, W)
    # dispatch beat (sees the jobs as registered: a job retiring now is still busy)
    if beat[0]:
        ddr_take_dispatch(S, beat, W[W_TMP])
    done_new = ddr_retire_jobs(S, W)
    SC[X_DONE] = (0 if done_out != 0 and ready else SC[X_DONE]) | done_new
    SC[X_NOW] = (SC[X_NOW] + 1) & ((np.int64(1) << P[P_AGE]) - 1)
    SC[X_CYCLE] += 1
    return hz, done_out


@njit(cache=True)
def counters_horizon(S):
    """``StreamingArray._counters_horizon``."""
    P, SL, CH, FF, FQ, GP, SC = S[AT_P], S[AT_SL], S[AT_CH], S[AT_FF], S[AT_FQ], S[AT_GP], S[AT_SC]
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
def fast_forward(S, k):
    """``StreamingArray.fast_forward`` by ``k`` cycles."""
    P, SL, CH, GP, SC = S[AT_P], S[AT_SL], S[AT_CH], S[AT_GP], S[AT_SC]
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
def idle(S):
    """``StreamingArray.idle``."""
    P, SL, CH, JB, PR, FQ, SC = S[AT_P], S[AT_SL], S[AT_CH], S[AT_JB], S[AT_PR], S[AT_FQ], S[AT_SC]
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
    """``fsedp.sim.fsedp._ddr_cause`` and ``_pe_cause``: the simulator's idle causes of one
    cycle, counted with ``weight``; ``DW``/``PW`` keep them for the cycles a skip repeats."""
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
    """``fsedp.sim.fsedp._count`` of the causes :func:`count_why` kept, over skipped cycles."""
    for ch in range(P[P_CHAN]):
        if DW[ch] >= 0:
            DI[DW[ch]] += weight
    for c in range(P[P_N]):
        if PW[c] >= 0:
            PI[PW[c]] += weight


@njit(cache=True)
def run(S, B, BT, nbeats, in_round, plan_n, wait_at):
    """``fsedp.sim.fsedp.fsedp_layer``'s cycle loop: run the layer's cycles until a job
    finishes (returns ``(DONE, mask)``, the scheduler is asked for more beats), the layer ends
    (``(ENDED, 0)``) or nothing can happen any more (``(STALLED, 0)``, the state as it is:
    ``fsedp.sw.streaming.watchdog``, the same cycle as the Python loop's).  The status is
    apart from the mask: on 64 chiplets a mask of every entry is -1 as an ``int64``.
    ``BT[b] = (kind, expert, entry, traj, order, cycle)`` are the beats to present, from
    ``SC[X_BPOS]`` on, each in its cycle, and ``done.ready`` is high in the round from cycle
    ``wait_at`` on (``fsedp.sw.scheduler_timing.SchedulerTiming``: the scheduler RTL's
    timing);
    ``S`` is the state (:data:`STATE`), ``B`` the layer's bookkeeping (:data:`BOOKS`)."""
    P, CH, SC = S[AT_P], S[AT_CH], S[AT_SC]
    DI, PI, DW, PW, started, computed, expected, peak, links, ddr_per, busy, TL, EVL = B
    n = P[P_N]
    ddr_why = np.zeros(P[P_CHAN], np.int64)
    pe_why = np.zeros(n, np.int64)
    occ = np.zeros(n, np.int64)
    ended = np.zeros(n, np.int64)
    beat = np.zeros(6, np.int64)
    st = (ddr_why, pe_why, occ, EVL, links, ddr_per, ended, busy)
    width = max(2 * n + 2, P[P_CHAN], P[P_NPRE], 4)
    ws = (
        np.zeros((NW, width), np.int64),
        np.zeros((n, 4), np.int64),
        np.zeros((2 * n + 2, NI), np.int64),
        np.zeros((n, P[P_K]), np.int64),
        np.zeros((n, NF), np.int64),
        np.zeros((n, P[P_H] + 2), np.int64),
    )
    # a skip that was due when the last call returned for the scheduler
    if SC[X_FF] > 1 and SC[X_BPOS] >= nbeats:
        k = SC[X_FF] - 1
        fast_forward(S, k)
        recount(P, DI, PI, DW, PW, k)
    SC[X_FF] = 0
    while in_round or SC[X_BPOS] < nbeats or not idle(S):
        SC[X_STEPS] += 1
        cycle = SC[X_CYCLE]
        b = SC[X_BPOS]
        if b < nbeats and BT[b, 5] == cycle:
            beat[0], beat[1], beat[2], beat[3] = 1, BT[b, 0], BT[b, 1], BT[b, 2]
            beat[4], beat[5] = BT[b, 3], BT[b, 4]
        else:
            beat[0] = 0
        ready = in_round and cycle >= wait_at
        h, done = step(S, beat, False, ready, st, ws)
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
        if done and ready:
            SC[X_FF] = h
            return DONE, done
        if h < 0 and SC[X_BPOS] >= nbeats and (in_round or not idle(S)):
            return STALLED, 0  # the progress watchdog: every further cycle is this one again
        if SC[X_BPOS] >= nbeats and h > 1:
            fast_forward(S, h - 1)
            recount(P, DI, PI, DW, PW, h - 1)
    return ENDED, 0


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
