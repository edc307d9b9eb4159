"""Stimulus of the block benches: random inputs and pause generators shared by the bench
bodies ``tb/tb_<block>.py`` (which run in Amaranth's simulator and under Verilator/Icarus
through ``tb/bench.py``) and the scheduler's drivers.  Plain Python: no simulator is imported
here."""

import random

from fsedp.params import SchedulerParams

__all__ = ["pause", "eit_records", "eit_include"]

#: chance of one more idle cycle before a beat on a driven stream
PAUSE = 0.2


def pause(rng: random.Random, chance: float = PAUSE) -> int:
    """Cycles a stream driver holds ``valid`` low before its next beat: geometric, so
    back-to-back beats, single gaps and long gaps all occur (every bench's pause generator)."""
    n = 0
    while rng.random() < chance:
        n += 1
    return n


def eit_records(p: SchedulerParams, rng: random.Random, rnd: int) -> list[tuple]:
    """Gate records ``(request, chiplet, expert)`` of EIT round ``rnd``: every fourth round
    hammers one (request, expert) entry, or a few, well past the count width (saturation and
    overflow); the others mix a hot expert with random ones, 5 % of the records drawn over
    the fields' whole width (ids out of range: ``bad_record``)."""
    hot = rng.randrange(p.experts)
    if rnd % 4 == 0:
        r = rng.randrange(p.requests)
        n = rng.randint(p.count_max + 1, 2 * p.count_max + 3)
        return [
            (r if rng.random() < 0.7 else rng.randrange(p.requests), rng.randrange(p.chiplets), hot)
            for _ in range(n)
        ]
    lim = (1 << p.request_bits, 1 << p.chiplet_bits, 1 << p.expert_bits)
    recs = []
    for _ in range(rng.randint(1, 3 * p.experts)):
        if rng.random() < 0.05:
            recs.append(tuple(rng.randrange(x) for x in lim))  # possibly out of range
        else:
            e = hot if rng.random() < 0.3 else rng.randrange(p.experts)
            recs.append((rng.randrange(p.requests), rng.randrange(p.chiplets), e))
    return recs


def eit_include(p: SchedulerParams, rng: random.Random, rnd: int) -> int | None:
    """The include mask of the deferral re-merge after round ``rnd`` (``None``: no re-merge):
    always after a hammering round, else 60 % of rounds; every eighth round all or none."""
    if not (rnd % 4 == 0 or rng.random() < 0.6):
        return None
    if rnd % 8 == 0:
        return rng.choice([0, (1 << p.requests) - 1])
    return rng.getrandbits(p.requests)
