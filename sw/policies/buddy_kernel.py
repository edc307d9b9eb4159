"""BuddyMoE's Algorithm 1 compiled (numba): the paper's loop over tokens and their missing
experts, with the token's experts checked in place of a set.  Driven by
:func:`fsedp.sw.policies.buddy.algorithm1_compiled`, which checks the inputs;
``tests/test_offload.py`` compares it with :func:`~fsedp.sw.policies.buddy.algorithm1_loop`.
"""

from numba import njit


@njit(cache=True)
def algorithm1(S, M, B, H, out):
    """``out`` = ``S`` with every non-resident expert (``M[e]`` false) replaced by the first
    of its first ``H`` buddies (``B[e]``, -1 padded) that is resident and not yet among the
    token's experts; the substitutions made, or -1 when an expert id of ``S`` is outside
    ``0 .. E-1``, -2 when a buddy id of ``B`` is outside ``-1 .. E-1`` (checked here: a
    check in numpy would cost ten times the substitution of a decode step).  ``S [T, K]``
    int64, ``M [E]`` bool, ``B [E, L]`` int64, ``out [T, K]`` int64."""
    T, K = S.shape
    E = M.shape[0]
    for t in range(T):
        for k in range(K):
            if S[t, k] < 0 or S[t, k] >= E:
                return -1
    for e in range(B.shape[0]):
        for r in range(B.shape[1]):
            if B[e, r] < -1 or B[e, r] >= E:
                return -2
    h = min(H, B.shape[1])
    made = 0
    for t in range(T):
        for k in range(K):
            out[t, k] = S[t, k]
        for k in range(K):
            e = out[t, k]
            if M[e]:
                continue
            for r in range(h):
                b = B[e, r]
                if b < 0 or not M[b]:
                    continue
                # the token's set U: its experts now (a replaced one is not resident, so it
                # can never be a buddy: checking the row is checking U)
                dup = False
                for j in range(K):
                    if out[t, j] == b:
                        dup = True
                        break
                if not dup:
                    out[t, k] = b
                    made += 1
                    break
    return made
