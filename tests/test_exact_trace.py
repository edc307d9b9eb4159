"""Exact expectations of the routing trace's core (``fsedp.trace.core``) on a trace written
out by hand: windows at the iteration's size, one below and one above, counts per expert,
sharding, request slots at the table's depth, the gate records and the pair counts."""

import numpy as np
import pytest

from fsedp.errors import InputError
from fsedp.trace.core import (
    RoutingTrace,
    dense_request_slots,
    expert_counts,
    gate_records,
    iteration_windows,
    pair_counts,
    shard,
    subset,
)


def trace() -> RoutingTrace:
    """5 tokens, 2 layers, top-2 of 4 experts; requests 7, 7, 3, 9, 3."""
    experts = np.array(
        [
            [[0, 1], [2, 3]],
            [[1, 2], [3, 0]],
            [[0, 3], [2, 1]],
            [[2, 0], [0, 1]],
            [[3, 1], [1, 2]],
        ]
    )
    return RoutingTrace(
        experts=experts,
        scores=None,
        token_ids=None,
        request=np.array([7, 7, 3, 9, 3]),
        position=np.array([0, 1, 0, 0, 1]),
        num_experts=4,
        name="t",
    )


def test_the_shape_of_a_trace():
    t = trace()
    assert (t.tokens, t.layers, t.top_k, len(t)) == (5, 2, 2, 5)


@pytest.mark.parametrize(
    "n, drop_last, windows",
    [
        (5, False, ["t[0:5]"]),
        (4, False, ["t[0:4]", "t[4:5]"]),
        (4, True, ["t[0:4]"]),
        (6, False, ["t[0:5]"]),
        (6, True, []),
        (1, True, ["t[0:1]", "t[1:2]", "t[2:3]", "t[3:4]", "t[4:5]"]),
        (2, False, ["t[0:2]", "t[2:4]", "t[4:5]"]),
    ],
)
def test_iteration_windows(n, drop_last, windows):
    got = list(iteration_windows(trace(), n, drop_last))
    assert [w.name for w in got] == windows
    if got:
        assert got[0].request.tolist() == [7, 7, 3, 9, 3][: got[0].tokens]


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "3"])
def test_a_window_must_be_a_positive_integer(n):
    with pytest.raises(InputError) as e:
        list(iteration_windows(trace(), n))
    assert e.value.field == "tokens_per_iteration"
    assert e.value.reason == f"must be a positive integer, not {n!r}"


def test_subset_keeps_the_chosen_tokens_in_order():
    s = subset(trace(), np.array([3, 0]), name="s")
    assert s.name == "s" and s.request.tolist() == [9, 7] and s.position.tolist() == [0, 0]
    assert s.experts[:, 0, :].tolist() == [[2, 0], [0, 1]] and s.num_experts == 4
    assert subset(trace(), slice(1, 2)).name == "t"


def test_expert_counts_by_hand():
    assert expert_counts(trace(), 0).tolist() == [3, 3, 2, 2]
    assert expert_counts(trace(), 1).tolist() == [2, 3, 3, 2]
    assert expert_counts(trace()).tolist() == [[3, 3, 2, 2], [2, 3, 3, 2]]
    for bad in (2, -1, True, 1.0):
        with pytest.raises(InputError) as e:
            expert_counts(trace(), bad)
        assert e.value.reason == f"must be in 0..1, not {bad!r}"


def test_sharding_by_request_and_by_token():
    assert shard(trace(), 2).tolist() == [1, 1, 1, 1, 1]
    assert shard(trace(), 4).tolist() == [3, 3, 3, 1, 3]
    assert shard(trace(), 2, "token").tolist() == [0, 1, 0, 1, 0]
    assert shard(trace(), 1, "token").tolist() == [0, 0, 0, 0, 0]
    with pytest.raises(InputError, match="mode: must be 'request' or 'token', not 'x'"):
        shard(trace(), 2, "x")
    for bad in (0, True, 2.5):
        with pytest.raises(InputError, match="chiplets: must be a positive integer"):
            shard(trace(), bad)


def test_request_slots_in_order_of_first_appearance_up_to_the_depth():
    assert dense_request_slots(trace(), 3) == {7: 0, 3: 1, 9: 2}
    assert dense_request_slots(trace(), 4) == {7: 0, 3: 1, 9: 2}
    with pytest.raises(InputError) as e:
        dense_request_slots(trace(), 2)
    assert e.value.reason == "3 requests do not fit a request table of depth 2"


def test_gate_records_by_hand():
    t = trace()
    chip = np.array([0, 1, 2, 3, 0])
    slots = {7: 0, 3: 1, 9: 2}
    assert gate_records(t, 1, chip, slots) == [
        (0, 0, 2), (0, 0, 3), (0, 1, 3), (0, 1, 0), (1, 2, 2),
        (1, 2, 1), (2, 3, 0), (2, 3, 1), (1, 0, 1), (1, 0, 2),
    ]  # fmt: skip
    # default slots: the request ids, or modulo the depth
    assert [r for r, _, _ in gate_records(t, 0, chip)][::2] == [7, 7, 3, 9, 3]
    assert [r for r, _, _ in gate_records(t, 0, chip, table_depth=4)][::2] == [3, 3, 3, 1, 3]
    # an array of slots indexed by request id
    table = np.arange(10) % 3
    assert [r for r, _, _ in gate_records(t, 0, chip, table)][::2] == [1, 1, 0, 0, 0]


@pytest.mark.parametrize(
    "kwargs, field, reason",
    [
        ({"chiplet_of_token": [0, 1]}, "chiplet_of_token", "must be 5 integers (one per token)"),
        ({"chiplet_of_token": [0.0] * 5}, "chiplet_of_token", "must be 5 integers"),
        ({"chiplet_of_token": [0, 0, -1, 0, 0]}, "chiplet_of_token", "chiplets must be >= 0"),
        ({"table_depth": 0}, "table_depth", "must be a positive integer, not 0"),
        ({"table_depth": True}, "table_depth", "must be a positive integer, not True"),
        ({"request_slot": {7: 0, 3: 1}}, "request_slot", "no slot for request 9"),
        ({"request_slot": np.arange(9)}, "request_slot", "no slot for request 9 (the table"),
        (
            {"request_slot": {7: 0, 3: 1, 9: 2}, "table_depth": 2},
            "request_slot",
            "slots must be in 0..1, found 0..2",
        ),
        (
            {"request_slot": {7: -1, 3: 1, 9: 0}, "table_depth": 2},
            "request_slot",
            "slots must be in 0..1, found -1..1",
        ),
    ],
)
def test_gate_records_refusals(kwargs, field, reason):
    args = {"chiplet_of_token": [0, 1, 2, 3, 0], **kwargs}
    chip = args.pop("chiplet_of_token")
    with pytest.raises(InputError) as e:
        gate_records(trace(), 0, chip, **args)
    assert e.value.field == field and e.value.reason.startswith(reason)


def test_gate_records_at_the_depth_exactly():
    recs = gate_records(trace(), 0, [0] * 5, {7: 0, 3: 1, 9: 1}, table_depth=2)
    assert {r for r, _, _ in recs} == {0, 1}


def test_pair_counts_by_hand():
    a = np.array([[0, 1], [1, 2]])
    b = np.array([[2], [2]])
    assert pair_counts(a, b, 3).tolist() == [[0, 0, 1], [0, 0, 2], [0, 0, 1]]
    co = pair_counts(a, a, 3, other_slots=True)
    assert co.tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    w = pair_counts(a, b, 3, weight=lambda x, y: np.array([0.5, 2.0]) * (x + 1))
    assert w.tolist() == [[0, 0, 0.5], [0, 0, 1.0 + 2.0], [0, 0, 4.0]]
