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


def test_a_fresh_host_may_defer_in_its_first_iteration_and_flushes_nothing():
    """Nothing measured yet: the longest iteration is 0 and no layer is done, so one more
    deferral is taken to cost nothing; a request in its only iteration, at the very start,
    has latency 0 and delay 0: 0 + 1.25 x 0 <= 0.  No layer run: the flush is empty."""
    tb = tiny_buffering([layer(0, 0, [4])])
    assert (tb.longest, tb.layers_done, tb.now, tb.deferrals) == (0, 0, 0, 0)
    assert tb.flush() == [] and tb.iter_end == {}
    tb = tiny_buffering([layer(0, 0, [4])])
    tb._begin_iteration(0)
    assert tb._may_defer(4, 0) is True and tb.layers_done == 0


def test_the_projection_of_the_running_iteration():
    """Iteration 3 began at 1000; nothing measured before it (longest 0).  With no layer done
    the projection is 0: a delay of 200 fits the slack of 200 exactly.  With 2 of 4 layers
    done in 70 cycles the iteration projects to 70 x 4 / 2 = 140: 70 + 1.25 x 140 = 245 >
    200."""
    tb = host(last={7: 1}, first={7: 0}, iter_start={0: 0, 3: 1000}, iter_end={1: 1000})
    tb.longest, tb.layers_done, tb.now = 0, 0, 1200
    assert tb._may_defer(7, 3) is True
    tb.now = 1201
    assert tb._may_defer(7, 3) is False
    tb.layers_done, tb.now = 2, 1070
    assert tb._may_defer(7, 3) is False
    tb.now = 1050  # 50 x 4 / 2 = 100: 50 + 125 = 175 <= 200
    assert tb._may_defer(7, 3) is True


def test_the_slack_sets_the_scheduler_threshold():
    """One buffering opportunity per 1 / slack rounds: slack 0.5 -> N_threshold 2."""
    tb = TokenBuffering(tiny_buffering([layer(0, 0, [1])]).setup, [layer(0, 0, [1])], slack=0.5)
    assert tb.sched.p.n_threshold == 2 and tb.slack == 0.5
    assert tiny_buffering([layer(0, 0, [1])]).sched.p.n_threshold == 5


def a5_setup():
    d = copy.deepcopy(TINY)
    d["scheduler"] = {
        "requests": 8, "theta_min": 2, "n_threshold": 4, "qos_width": 4, "t_qos_init": 2,
    }  # fmt: skip
    return make_setup(run_from_dict(d, "tiny.yaml"))


def rlayer(i, l, requests, records):
    return SimpleNamespace(
        iteration=i, layer=l, requests=dict(enumerate(requests)), records=records
    )


def test_a_request_deferred_pauses_for_the_rest_of_its_iteration():
    """Requests 10 (slot 0) and 20 (slot 1), T_QoS 2, two iterations of two layers.  Request
    10 sends two tokens to experts 0 and 1 (2 tokens each: not cold); request 20 one token
    to experts 2 and 3 (1 token each, below theta_min 2: a cold hit) and is deferred at layer
    0 of iteration 0: it pauses, so its layer-1 records wait too; both layers' records join
    iteration 1, where its new token makes experts 2 and 3 warm (2 tokens): it runs."""
    a = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    b0, b1 = [(1, 2, 2), (1, 2, 3)], [(1, 3, 2), (1, 3, 3)]
    layers = [rlayer(0, 0, [10, 20], a + b0), rlayer(0, 1, [10, 20], a + b0)]
    layers += [rlayer(1, 0, [10, 20], a + b1), rlayer(1, 1, [10, 20], a + b1)]
    setup = a5_setup()
    tb = TokenBuffering(setup, layers)
    carried = [(20, 2, 2), (20, 2, 3)]

    res = tb.layer(layers[0])
    assert tb.slot == {10: 0, 20: 1} and res.defer == 0b10 and tb.deferrals == 1
    assert res.strategy == "FSE-DP A5"
    assert tb.paused == {20} and tb.next_carry == {0: carried} and tb.layers_done == 1
    assert tb.now == res.cycles + setup.dense_cycles(3) and tb.done_at == {10: tb.now}

    res = tb.layer(layers[1])  # 20 is paused: its records wait without a round
    assert res.defer == 0 and tb.deferrals == 1 and tb.layers_done == 2
    assert tb.next_carry == {0: carried, 1: carried} and tb.done_at == {10: tb.now}
    end0 = tb.now

    res = tb.layer(layers[2])
    assert tb.iter_end == {0: end0} and tb.longest == end0 and tb.layers_done == 1
    assert res.defer == 0 and tb.paused == set() and tb.carry == {1: carried}
    assert tb.done_at == {10: tb.now, 20: tb.now}
    res = tb.layer(layers[3])
    assert tb.carry == {} and tb.next_carry == {} and tb.done_at == {10: tb.now, 20: tb.now}
    assert tb.flush() == [] and tb.iter_end == {0: end0, 1: tb.now}
    q = tb.qos()
    assert (q["requests"], q["deferrals"], q["delayed"], q["violations"]) == (2, 1, 0, 0)


def test_the_flush_runs_what_is_left_layer_by_layer():
    """Left after the run: layer 0 (request 20, carried out of the last iteration), layer 1
    (nothing), layer 2 (request 10, carried in and not run), layer 3 (request 10 and 20).
    Each runs as A3 with the requests in slots by id; the clock moves by each layer."""
    from fsedp.sim.fsedp import fsedp_layer

    setup = a5_setup()
    tb = TokenBuffering(setup, [rlayer(0, 0, [10, 20], [])])
    tb._begin_iteration(0)
    tb.now = 50
    tb.carry = {1: [], 2: [(10, 1, 4), (10, 1, 5)]}
    tb.next_carry = {
        0: [(20, 2, 2), (20, 2, 3)],
        3: [(20, 0, 6), (20, 0, 7), (10, 3, 6), (10, 3, 8)],
    }
    out = tb.flush()
    assert [r.strategy for r in out] == ["FSE-DP A5 (flush)"] * 3
    want = [
        fsedp_layer(setup, [(0, 2, 2), (0, 2, 3)], "A3"),
        fsedp_layer(setup, [(0, 1, 4), (0, 1, 5)], "A3"),
        fsedp_layer(setup, [(1, 0, 6), (1, 0, 7), (0, 3, 6), (0, 3, 8)], "A3"),
    ]
    assert [r.cycles for r in out] == [w.cycles for w in want]
    t = [50]
    for w, tokens in zip(want, (1, 1, 2)):
        t.append(t[-1] + w.cycles + setup.dense_cycles(tokens))
    assert tb.done_at == {20: t[3], 10: t[3]} and tb.now == t[3]
    assert tb.iter_end == {0: 50} and tb.carry == {} and tb.next_carry == {}


def test_the_qos_report_in_another_clock_and_at_its_rounding():
    """1.25 ns a cycle.  Delays 0, 1 and 987 cycles (0, 0.00125 and 1.23375 us): one cycle
    is a delay; the mean 0.41166.. us rounds to 0.41, the 99th percentile (0.98 of the way
    from 1 to 987 cycles: 967.28 cycles, 1.2091 us) to 1.21, the max to 1.23.  Latencies
    1000 cycles (slack 200 = 0.25 us): the worst ratio 987 / 200 = 4.935."""
    tb = host(
        first={1: 0, 2: 0, 3: 0},
        last={1: 0, 2: 0, 3: 0},
        iter_start={0: 0},
        iter_end={0: 1000},
    )
    tb.setup = SimpleNamespace(ns_per_cycle=1.25)
    tb.done_at = {2: 1001, 3: 1987}  # request 1 never ran late: not in done_at
    tb.deferrals = 0
    q = tb.qos()
    assert q["delayed"] == 2 and q["delay_us"] == {"mean": 0.41, "p99": 1.21, "max": 1.23}
    assert q["slack_us"] == {"mean": 0.25, "p99": 0.25, "max": 0.25}
    assert q["delay_over_slack_max"] == 4.935 and q["violations"] == 1


def test_violations_at_the_slack_and_a_request_of_no_latency():
    """A delay of exactly the slack is no violation, nor one of 1 + 1e-9 times it (the
    tolerance), but one more is; a request whose iterations took no time has ratio 0."""
    tb = host(first={1: 0}, last={1: 0}, iter_start={0: 0}, iter_end={0: 1000})
    tb.setup = SimpleNamespace(ns_per_cycle=1.0)
    tb.deferrals = 0
    tb.done_at = {1: 1200}
    assert tb.qos()["violations"] == 0 and tb.qos()["delay_over_slack_max"] == 1.0
    tb.slack, tb.iter_end, tb.done_at = 1.0, {0: 10**9}, {1: 2 * 10**9 + 1}
    assert tb.qos()["violations"] == 0  # (1e9 + 1) / 1e9 is 1 + 1e-9 in floating point
    tb.done_at = {1: 2 * 10**9 + 2}
    assert tb.qos()["violations"] == 1
    tb = host(first={1: 0}, last={1: 0}, iter_start={0: 5}, iter_end={0: 5})
    tb.setup, tb.deferrals, tb.done_at = SimpleNamespace(ns_per_cycle=1.0), 0, {1: 5}
    q = tb.qos()
    assert q["delay_over_slack_max"] == 0.0 and q["violations"] == 0
