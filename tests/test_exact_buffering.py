"""Exact expectations of A5's host (``fsedp.sim.buffering``) on timelines written out by
hand: when a request may still be deferred within its QoS slack (at the slack exactly, one
cycle either side), which request-table slot a request takes and frees, when buffering is
switched off for a window, and the QoS report's figures."""

import copy
from types import SimpleNamespace

import pytest
from tiny import TINY

from fsedp.config import run_from_dict
from fsedp.sim.buffering import SLACK, TokenBuffering
from fsedp.sim.setup import make_setup


def host(**state) -> TokenBuffering:
    """A host with the given clock state (no layers run)."""
    tb = TokenBuffering.__new__(TokenBuffering)
    base = dict(buffering=True, slack=SLACK, per_iter=4, layers_done=2, longest=100,
                iter_start={}, iter_end={}, first={}, last={}, now=0)  # fmt: skip
    base.update(state)
    for k, v in base.items():
        setattr(tb, k, v)
    return tb


def test_a_request_before_its_last_iteration_may_always_be_deferred():
    tb = host(last={7: 3}, first={7: 0}, iter_start={0: 0, 2: 500}, now=10_000)
    assert tb._may_defer(7, 2) is True
    tb.buffering = False
    assert tb._may_defer(7, 2) is False


@pytest.mark.parametrize("first_start, allowed", [(374, True), (375, True), (376, False)])
def test_the_slack_of_a_request_in_its_last_iteration(first_start, allowed):
    """Iteration 2 began at 900; 2 of its 4 layers took 50 cycles: projected 100, the
    longest so far 100, so one more deferral costs 1.25 x 100 = 125.  Its end is taken as
    900 + 100 = 1000; the request began at ``first_start``: its latency is 1000 -
    first_start, its slack 20 % of that: 125 exactly at 375."""
    tb = host(last={7: 2}, first={7: 0}, iter_start={0: first_start, 2: 900}, now=950)
    assert tb._may_defer(7, 2) is allowed


def test_the_slack_counts_the_delay_already_added():
    """Iteration 1 (the request's last) ended at 1000, the request began at 0: its slack is
    200.  In iteration 3, begun at 1000, the delay so far is now - 1000."""
    tb = host(last={7: 1}, first={7: 0}, iter_start={0: 0, 3: 1000}, iter_end={1: 1000})
    tb.now, tb.longest, tb.layers_done = 1075, 0, 0
    assert tb._may_defer(7, 3) is True  # no iteration measured yet: 75 + 0 <= 200
    tb.longest = 100
    assert tb._may_defer(7, 3) is True  # 75 + 1.25 x 100 = 200: at the slack
    tb.now = 1076
    assert tb._may_defer(7, 3) is False  # 201
    tb.now, tb.layers_done = 1050, 2  # 50 cycles over 2 of 4 layers: projected 100
    assert tb._may_defer(7, 3) is True  # 50 + 125 = 175
    tb.now = 1080  # projected 160, more than the longest: 80 + 200 = 280
    assert tb._may_defer(7, 3) is False


def tiny_buffering(layers):
    d = copy.deepcopy(TINY)
    d["scheduler"] = "default"
    setup = make_setup(run_from_dict(d, "tiny.yaml"))
    return TokenBuffering(setup, layers)


def layer(i, l, requests):
    return SimpleNamespace(iteration=i, layer=l, requests=dict(enumerate(requests)), records=[])


def test_request_slots_are_taken_in_order_of_first_token_and_freed_after_the_last():
    """Window 0 holds requests 5 and 2, window 1 holds 2 and 9, window 2 holds 9.  Slots in
    order of first iteration, then id: 2 -> 0, 5 -> 1; 9 takes the lowest slot free when
    it arrives, 5's (its last iteration is over, nothing of it carried)."""
    layers = [layer(0, 0, [5, 2]), layer(1, 0, [2, 9]), layer(2, 0, [9])]
    tb = tiny_buffering(layers)
    assert (tb.first, tb.last, tb.per_iter) == ({5: 0, 2: 0, 9: 1}, {5: 0, 2: 1, 9: 2}, 1)
    tb._begin_iteration(0)
    assert tb.slot == {2: 0, 5: 1} and tb.buffering is True
    tb._begin_iteration(1)  # 5's last iteration is over and nothing of it is carried
    assert tb.slot == {2: 0, 9: 1}
    assert tb.iter_end == {0: 0} and tb.iter_start == {0: 0, 1: 0}
    tb.next_carry = {0: [(2, 1, 3)]}  # request 2 deferred in iteration 1: carried
    tb._begin_iteration(2)
    assert tb.slot == {2: 0, 9: 1} and tb.carry == {0: [(2, 1, 3)]}


def test_buffering_is_off_for_a_window_whose_requests_and_the_next_would_not_fit():
    depth = tiny_buffering([layer(0, 0, [0])]).depth
    now = list(range(depth))
    nxt = [depth + k for k in range(1)]
    tb = tiny_buffering([layer(0, 0, now), layer(1, 0, now[1:] + nxt)])
    tb._begin_iteration(0)
    assert len(tb.slot) == depth and tb.buffering is False  # depth + 1 would be needed
    tb = tiny_buffering([layer(0, 0, now[:-1]), layer(1, 0, now[1:-1] + nxt)])
    tb._begin_iteration(0)
    assert tb.buffering is True  # exactly depth


def test_the_qos_report_by_hand():
    """Two requests over iterations 0..1 (0 -> 1000 -> 2000 cycles at 1 ns a cycle):
    request 1 ran in both (latency 2000, slack 400), its last record 300 cycles late;
    request 2 only in iteration 1 (latency 1000, slack 200), on time."""
    tb = host(
        first={1: 0, 2: 1},
        last={1: 1, 2: 1},
        iter_start={0: 0, 1: 1000},
        iter_end={0: 1000, 1: 2000},
    )
    tb.setup = SimpleNamespace(ns_per_cycle=1.0)
    tb.done_at = {1: 2300, 2: 1900}
    tb.deferrals = 3
    q = tb.qos()
    assert q["requests"] == 2 and q["deferrals"] == 3 and q["delayed"] == 1
    assert q["delay_us"] == {"mean": 0.15, "p99": 0.3, "max": 0.3}
    assert q["slack_us"] == {"mean": 0.3, "p99": 0.4, "max": 0.4}
    assert q["delay_over_slack_max"] == 0.75 and q["violations"] == 0
    tb.done_at[2] = 2201  # 201 > 200: one violation
    assert tb.qos()["violations"] == 1
