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
        (0, 0, 2),
        (0, 0, 3),
        (0, 1, 3),
        (0, 1, 0),
        (1, 2, 2),
        (1, 2, 1),
        (2, 3, 0),
        (2, 3, 1),
        (1, 0, 1),
        (1, 0, 2),
    ]
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


# -- refusals named exactly: file, field and reason ----------------------------------------


def refusal(fn, *args, **kwargs) -> tuple:
    """``(file, field, reason)`` of the :class:`InputError` that ``fn(*args, **kwargs)``
    raises."""
    with pytest.raises(InputError) as e:
        fn(*args, **kwargs)
    return e.value.file, e.value.field, e.value.reason


def made(experts, num_experts=4, **kw) -> RoutingTrace:
    """A trace of ``experts`` with requests and positions 0 (``kw`` replaces any field)."""
    experts = np.asarray(experts)
    args = {
        "experts": experts,
        "scores": None,
        "token_ids": None,
        "request": np.zeros(len(experts), np.int64),
        "position": np.zeros(len(experts), np.int64),
        "num_experts": num_experts,
        "name": "hand",
    }
    return RoutingTrace(**{**args, **kw})


@pytest.mark.parametrize(
    "kw, field, reason",
    [
        ({"num_experts": True}, "num_experts", "must be an integer in 1..4096, not True"),
        ({"num_experts": 0}, "num_experts", "must be an integer in 1..4096, not 0"),
        ({"num_experts": 4097}, "num_experts", "must be an integer in 1..4096, not 4097"),
        ({"num_experts": 4.0}, "num_experts", "must be an integer in 1..4096, not 4.0"),
        ({"num_experts": "4"}, "num_experts", "must be an integer in 1..4096, not '4'"),
        ({"experts": np.zeros((2, 1, 1))}, "experts", "must hold integers, not float64"),
        (
            {"experts": np.zeros((2, 1))},
            "experts",
            "must be 3-D [tokens, layers, k], not shape (2, 1)",
        ),
        (
            {"experts": np.zeros((1, 1, 3), int), "num_experts": 2},
            "experts",
            "top-k = 3 exceeds num_experts = 2",
        ),
        ({"experts": [[[0, 4]]]}, "experts", "expert ids must be in 0..3, found 0..4"),
        ({"experts": [[[-1, 2]]]}, "experts", "expert ids must be in 0..3, found -1..2"),
        # the duplicate is found by its token and layer, whatever its place within the k
        ({"experts": [[[0, 1]], [[2, 2]]]}, "experts", "token 1 layer 0 repeats an expert: [2, 2]"),
        (
            {"experts": [[[0, 1, 2], [0, 1, 3]], [[0, 1, 2], [3, 0, 3]]]},
            "experts",
            "token 1 layer 1 repeats an expert: [3, 0, 3]",
        ),
        (
            {"experts": [[[0, 1, 2], [0, 1, 3]], [[0, 1, 2], [1, 3, 1]]]},
            "experts",
            "token 1 layer 1 repeats an expert: [1, 3, 1]",
        ),
        (
            {"scores": np.zeros((2, 1, 1))},
            "scores",
            "shape (2, 1, 1) differs from experts (1, 1, 2)",
        ),
        ({"scores": np.zeros((1, 1, 2), bool)}, "scores", "must hold numbers, not bool"),
        ({"scores": np.array([[["a", "b"]]])}, "scores", "must hold numbers, not <U1"),
        ({"scores": np.array([[[1j, 0]]])}, "scores", "must hold numbers, not complex128"),
        ({"scores": np.array([[[np.nan, 0]]], np.float32)}, "scores", "must be finite"),
        (
            {"scores": np.array([[[0, 4e38]]])},
            "scores",
            "must fit float32 (|score| <= 3.403e+38), found 0..4e+38",
        ),
        (
            {"scores": np.array([[[-4e38, 0]]])},
            "scores",
            "must fit float32 (|score| <= 3.403e+38), found -4e+38..0",
        ),
        ({"token_ids": [1, 2]}, "token_ids", "must have shape (1,) (one per token), not (2,)"),
        ({"token_ids": [1.0]}, "token_ids", "must hold integers, not float64"),
        ({"token_ids": [-3]}, "token_ids", "must be >= 0, found -3"),
        ({"request": [2**31]}, "request", "does not fit int32"),
        ({"position": [-1]}, "position", "must be >= 0, found -1"),
    ],
)
def test_a_trace_refuses_by_name(kw, field, reason):
    assert refusal(made, **{"experts": [[[0, 1]]], **kw}) == ("hand", field, reason)


def test_a_trace_at_the_edges_of_its_fields():
    """One expert, ids at 0 and num_experts - 1, scores at float32's limits (given as
    float64), integer scores, int32's largest request id, an empty trace with float scores."""
    t = made([[[0]]], num_experts=1)
    assert t.num_experts == 1 and t.experts.dtype == np.int16
    big = float(np.finfo(np.float32).max)
    t = made([[[0, 3]]], num_experts=np.int64(4), scores=np.array([[[-big, big]]]))
    assert t.scores.dtype == np.float32 and t.scores.tolist() == [[[-big, big]]]
    assert type(t.num_experts) is int
    t = made([[[0, 3]]], scores=np.array([[[2, -7]]]), request=[2**31 - 1], token_ids=[0])
    assert t.scores.tolist() == [[[2.0, -7.0]]] and t.scores.dtype == np.float32
    assert t.request.tolist() == [2**31 - 1] and t.request.dtype == np.int32
    assert t.token_ids.dtype == np.int32 and t.position.dtype == np.int32
    t = made(np.zeros((0, 1, 2), np.int16), scores=np.zeros((0, 1, 2)))
    assert t.tokens == 0 and t.scores.shape == (0, 1, 2)


def test_a_trace_keeps_its_own_arrays_and_copies_a_read_only_one():
    """Arrays already in the stored dtype are taken as they are (a long trace is not copied);
    a read-only one (a view of a file) is copied, so that the trace's arrays are writable."""
    e = np.array([[[0, 1]]], np.int16)
    sc = np.array([[[0.5, 0.25]]], np.float32)
    req = np.array([3], np.int32)
    t = made(e, scores=sc, request=req)
    assert t.experts is e and t.scores is sc and t.request is req
    ro = np.array([[[0, 1]]], np.int16)
    ro.flags.writeable = False
    t = made(ro)
    assert t.experts.flags.writeable and not np.shares_memory(t.experts, ro)
    assert t.experts.tolist() == [[[0, 1]]]


def test_a_duplicate_beyond_the_first_slice_of_tokens_is_named_by_its_token():
    """The duplicate check sorts the trace in slices of ``_CHUNK // (layers * k)`` tokens:
    a repeat in the second slice is reported with its own token index."""
    from fsedp.trace.core import _CHUNK

    step = _CHUNK // 2
    e = np.zeros((step + 3, 1, 2), np.int16)
    e[:, 0, 1] = 1
    e[step + 2, 0] = [3, 3]
    assert refusal(made, e) == (
        "hand",
        "experts",
        f"token {step + 2} layer 0 repeats an expert: [3, 3]",
    )


@pytest.mark.parametrize(
    "shape, entries, why",
    [
        ((2, 3), None, "must be 3-D [tokens, layers, k], not shape (2, 3)"),
        ((1, 0, 1), None, "needs at least one layer and one expert per token, shape (1, 0, 1)"),
        ((1, 1, 0), None, "needs at least one layer and one expert per token, shape (1, 1, 0)"),
        ((1, 1025, 1), None, "1025 layers (shape (1, 1025, 1)); a trace has at most 1024"),
        (
            (1, 1, 65),
            None,
            "top-k = 65 (shape (1, 1, 65)); a trace has at most 64 experts per token",
        ),
        (
            (2, 3, 4),
            23,
            "shape (2, 3, 4) is 24 (token, layer, expert) entries; a trace file holds at most 23",
        ),
        ((2, 3, 4), 24, None),
        ((1, 1024, 64), None, None),
        ((0, 1, 1), 0, None),
    ],
)
def test_experts_shape_problem_at_its_limits(shape, entries, why):
    from fsedp.trace.core import experts_shape_problem

    assert experts_shape_problem(shape, 64, entries=entries) == why


def test_refusals_name_the_trace_and_the_field():
    t = trace()
    assert refusal(dense_request_slots, t, 2)[:2] == ("t", "request")
    assert refusal(shard, t, 0) == ("t", "chiplets", "must be a positive integer, not 0")
    assert refusal(shard, t, 2, "x")[:2] == ("t", "mode")
    assert refusal(expert_counts, t, 2) == ("t", "layer", "must be in 0..1, not 2")
    assert refusal(lambda: list(iteration_windows(t, 0)))[:2] == ("t", "tokens_per_iteration")
    chip = [0] * 5
    assert refusal(gate_records, t, 0, [0, 1])[:2] == ("t", "chiplet_of_token")
    assert refusal(gate_records, t, 0, [0, 0, -1, 0, 0])[:2] == ("t", "chiplet_of_token")
    assert refusal(gate_records, t, 0, chip, table_depth=0)[:2] == ("t", "table_depth")
    assert refusal(gate_records, t, 0, chip, {7: 0})[:2] == ("t", "request_slot")
    assert refusal(gate_records, t, 0, chip, np.arange(9))[:2] == ("t", "request_slot")
    assert refusal(gate_records, t, 0, chip, {7: 0, 3: 1, 9: 2}, table_depth=2)[:2] == (
        "t",
        "request_slot",
    )


def test_a_table_of_depth_one():
    """Every request in slot 0 of a one-row table."""
    recs = gate_records(trace(), 0, [0] * 5, {7: 0, 3: 0, 9: 0}, table_depth=1)
    assert {r for r, _, _ in recs} == {0}


def test_counts_are_integers_for_every_expert_also_one_never_chosen():
    t = made([[[0, 2]], [[2, 0]]], num_experts=4)
    c = expert_counts(t, 0)
    assert c.tolist() == [2, 0, 2, 0] and c.dtype == np.int64
    assert expert_counts(t).dtype == np.int64 and expert_counts(t).tolist() == [[2, 0, 2, 0]]


def test_subset_carries_scores_and_token_ids():
    t = made(
        [[[0, 1]], [[2, 3]], [[1, 2]]],
        scores=np.array([[[0.5, 0.25]], [[1.0, 2.0]], [[3.0, 4.0]]]),
        token_ids=[10, 11, 12],
        request=[0, 1, 2],
    )
    s = subset(t, [2, 0])
    assert s.scores.tolist() == [[[3.0, 4.0]], [[0.5, 0.25]]] and s.token_ids.tolist() == [12, 10]


def test_pair_counts_weighted_by_both_slots():
    """weight(x, y): token 0 pairs a[0, x] with b[0, y]; weight x + 10 y."""
    a = np.array([[0, 1]])
    b = np.array([[1, 2]])
    w = pair_counts(a, b, 3, weight=lambda x, y: np.array([x + 10.0 * y]))
    # (0,1) x0 y0: 0; (0,2) x0 y1: 10; (1,1) x1 y0: 1; (1,2) x1 y1: 11
    assert w.tolist() == [[0, 0, 10], [0, 1, 11], [0, 0, 0]]


# -- the synthetic trace ---------------------------------------------------------------------


def synth(*args, **kw):
    from fsedp.trace.core import synthetic

    return synthetic(*args, **kw)


@pytest.mark.parametrize(
    "args, kw, field, reason",
    [
        (("4", 1, 1), {}, "num_experts", "must be an integer, not '4'"),
        ((4.0, 1, 1), {}, "num_experts", "must be an integer, not 4.0"),
        ((True, 1, 1), {}, "num_experts", "must be an integer, not True"),
        ((0, 1, 1), {}, "num_experts", "must be 1..4096, not 0"),
        ((4097, 1, 1), {}, "num_experts", "must be 1..4096, not 4097"),
        ((4, 5, 1), {}, "top_k", "must be 1..4, not 5"),
        ((128, 65, 1), {}, "top_k", "must be 1..64, not 65"),
        ((4, 0, 1), {}, "top_k", "must be 1..4, not 0"),
        ((4, 1, -1), {}, "tokens", "must be >= 0, not -1"),
        ((4, 1, 1), {"layers": 1025}, "layers", "must be 1..1024, not 1025"),
        ((4, 1, 1), {"layers": 0}, "layers", "must be 1..1024, not 0"),
        ((4, 1, 1), {"requests": 2}, "requests", "must be 1..1, not 2"),
        ((4, 1, 5), {"requests": 0}, "requests", "must be 1..5, not 0"),
        ((4, 1, 1), {"skew": "x"}, "skew", "must be a number, not 'x'"),
        ((4, 1, 1), {"skew": None}, "skew", "must be a number, not None"),
        ((4, 1, 1), {"skew": -1}, "skew", "must be finite and >= 0, not -1.0"),
        ((4, 1, 1), {"skew": float("inf")}, "skew", "must be finite and >= 0, not inf"),
    ],
)
def test_synthetic_refuses_by_name(args, kw, field, reason):
    assert refusal(synth, *args, **kw) == ("synthetic", field, reason)


def test_synthetic_at_its_edges():
    """One expert; the largest layer count; requests in equal blocks by hand (token i is in
    request i * R // T: 5 tokens, 2 requests -> 0 0 0 1 1, positions 0 1 2 0 1)."""
    t = synth(1, 1, 3)
    assert t.experts.tolist() == [[[0]]] * 3 and t.name == "synthetic"
    assert synth(4, 1, 1, layers=1024).layers == 1024
    t = synth(4, 1, 5, requests=2)
    assert t.request.tolist() == [0, 0, 0, 1, 1] and t.position.tolist() == [0, 1, 2, 0, 1]
    assert synth(4, 2, 2, requests=2).request.tolist() == [0, 1]
    t = synth(4, 2, 0)
    assert t.tokens == 0 and t.request.tolist() == [] and t.position.tolist() == []
    assert synth(4, 2, 1, requests=1).position.tolist() == [0]


def test_synthetic_defaults_are_the_documented_ones():
    a, b = synth(8, 2, 40, layers=2), synth(8, 2, 40, layers=2, seed=0, skew=1.1)
    assert np.array_equal(a.experts, b.experts)
    assert a.request.tolist() == [0] * 20 + [1] * 20  # 40 // 16 = 2 requests: 0..19, 20..39
    assert not np.array_equal(a.experts, synth(8, 2, 40, layers=2, seed=1).experts)


def test_synthetic_draws_the_popular_experts_first():
    """With skew 60 the expert of rank r weighs 2^-60 as much as rank r - 1's: every token
    draws the seeded generator's first permutation in order (its first draw: the popularity
    order of layer 0), most popular first."""
    for seed in (1, 2, 3):
        perm = np.random.default_rng(seed).permutation(16)
        t = synth(16, 3, 50, seed=seed, skew=60)
        assert t.experts[:, 0, :].tolist() == [perm[:3].tolist()] * 50
        t = synth(16, 1, 50, seed=seed, skew=60)
        assert t.experts[:, 0, 0].tolist() == [perm[0]] * 50
        # many experts: the top-1 is found by a partial sort of 4096 keys
        perm = np.random.default_rng(seed).permutation(4096)
        assert synth(4096, 1, 20, seed=seed, skew=60).experts[:, 0, 0].tolist() == [perm[0]] * 20


def test_synthetic_draws_a_long_trace_in_slices():
    """4096 experts draw their keys in slices of ``_CHUNK // 4096`` = 1024 tokens: 1025
    tokens take a second slice of one token."""
    from fsedp.trace.core import _CHUNK

    step = _CHUNK // 4096
    t = synth(4096, 2, step + 1, skew=0)
    assert t.experts.shape == (step + 1, 1, 2)
    assert (t.experts[:, 0, 0] != t.experts[:, 0, 1]).all()


# -- the npz reader ----------------------------------------------------------------------------


def patched(path, member: str, *, usize=None, flags=None, method=None, csize_times=None):
    """Rewrite the zip's central-directory entry of ``member`` (what a reader trusts): its
    uncompressed size, flag bits or method."""
    import struct

    data = bytearray(path.read_bytes())
    at = 0
    while (at := data.find(b"PK\x01\x02", at)) >= 0:
        nlen = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + nlen].decode() == member:
            if flags is not None:
                struct.pack_into("<H", data, at + 8, flags)
            if method is not None:
                struct.pack_into("<H", data, at + 10, method)
            if usize is not None:
                struct.pack_into("<I", data, at + 24, usize)
            path.write_bytes(bytes(data))
            return struct.unpack_from("<I", data, at + 20)[0]  # the compressed size
        at += 4
    raise AssertionError(f"no member {member}")


def reader(path, limit=1 << 20):
    from fsedp.trace.core import NpzReader

    return NpzReader(path, limit)


def test_npz_reader_refuses_at_opening(tmp_path):
    p = tmp_path / "x.npz"
    p.write_bytes(b"hello")
    assert refusal(reader, p) == (
        str(p),
        "<file>",
        "not a readable npz file: BadZipFile: File is not a zip file",
    )
    np.savez(p, a=np.arange(3))  # stored: 128 bytes of header and 24 of data
    assert reader(p, 152).keys == ["a"]
    assert refusal(reader, p, 151) == (
        str(p),
        "a",
        "declares 152 bytes uncompressed; an array of this file holds at most 151",
    )
    patched(p, "a.npy", flags=1)
    assert refusal(reader, p) == (str(p), "a", "an encrypted zip member; not read")
    np.savez(p, a=np.arange(3))
    patched(p, "a.npy", method=12)
    assert refusal(reader, p) == (
        str(p),
        "a",
        "compressed with zip method 12; only stored and deflated members (what numpy writes) "
        "are read",
    )


def test_npz_reader_refuses_a_bomb_beyond_deflates_ratio(tmp_path):
    """A member may declare at most 1032 times its compressed size plus 1024 bytes."""
    p = tmp_path / "x.npz"
    np.savez_compressed(p, a=np.arange(3))
    c = patched(p, "a.npy", usize=0)
    patched(p, "a.npy", usize=1032 * c + 1024)
    assert reader(p, 1 << 30).keys == ["a"]
    patched(p, "a.npy", usize=1032 * c + 1025)
    assert refusal(reader, p, 1 << 30) == (
        str(p),
        "a",
        f"declares {1032 * c + 1025} bytes from {c} compressed bytes, more than deflate "
        "expands (1032:1): a zip bomb",
    )


def test_npz_reader_reads_arrays_exactly(tmp_path):
    """Fortran order, a member without ``.npy``, an array longer than one read (4 MiB), a
    value cap and the small-array caps at their limits."""
    import zipfile

    p = tmp_path / "x.npz"
    big = np.arange(600_000, dtype=np.int64)  # 4.8 MB
    np.savez(
        p,
        f=np.asfortranarray(np.arange(6).reshape(2, 3)),
        big=big,
        n64=np.arange(64, dtype=np.int8),
        n65=np.arange(65, dtype=np.int8),
        w=np.array([b"x" * 4096]),
        w2=np.array([b"x" * 4097]),
    )
    with zipfile.ZipFile(p, "a") as z:
        z.writestr("readme", b"not an array")
    with reader(p, 1 << 23) as z:
        assert z.keys == ["f", "big", "n64", "n65", "w", "w2", "readme"] and "readme" in z
        assert z.header("f") == ((2, 3), np.dtype(np.int64))
        assert z.array("f").tolist() == [[0, 1, 2], [3, 4, 5]]
        assert np.array_equal(z.array("big"), big)
        assert refusal(z.array, "f", 5) == (
            str(p),
            "f",
            "declares shape (2, 3) (6 values); at most 5",
        )
        assert z.array("f", 6).shape == (2, 3)
        assert z.small("n64").tolist() == list(range(64))
        assert refusal(z.small, "n65") == (
            str(p),
            "n65",
            "declares shape (65,) (65 values); at most 64",
        )
        assert z.small("w").tolist() == [b"x" * 4096]
        assert refusal(z.small, "w2") == (
            str(p),
            "w2",
            "dtype |S4097 is wider than 4096 bytes a value",
        )


def test_npz_reader_refuses_a_bad_member_by_name(tmp_path):
    """A header that lies about the data's size, a pickle, a CRC that does not match: in a
    small member (the zip reads it whole with its header), then in a long one."""
    import io
    import zipfile

    p = tmp_path / "x.npz"

    def npy(n):
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": "<i8", "fortran_order": False, "shape": (n,)}
        )
        return head.getvalue()

    obj = io.BytesIO()
    np.save(obj, np.array([{}, 1], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("short.npy", npy(3) + bytes(16))
        z.writestr("obj.npy", obj.getvalue())
        z.writestr("ok.npy", npy(3) + bytes(24))
        z.writestr("long.npy", npy(2000) + bytes(16000))
    with reader(p) as z:
        assert refusal(z.header, "short") == (
            str(p),
            "short",
            "declares shape (3,) of int64 (24 bytes) but the member holds 16 bytes of data",
        )
        assert refusal(z.header, "obj") == (
            str(p),
            "obj",
            "holds Python objects (a pickle); not read",
        )
        assert z.array("ok").tolist() == [0, 0, 0] and z.array("long").tolist() == [0] * 2000
    data = bytearray(p.read_bytes())
    for n in (3, 2000):
        at = data.find(npy(n) + bytes(8 * n)) + len(npy(n))
        data[at] ^= 1  # the first data byte: the member's CRC no longer matches
    p.write_bytes(bytes(data))
    bad = "BadZipFile: Bad CRC-32 for file"
    with reader(p) as z:
        assert refusal(z.array, "ok") == (
            str(p),
            "ok",
            f"not a readable .npy array: {bad} 'ok.npy'",
        )
        assert refusal(z.array, "long") == (str(p), "long", f"cannot read: {bad} 'long.npy'")


def test_npy_headers_by_version():
    import io

    from fsedp.trace.core import read_npy_header

    for version in ((1, 0), (2, 0)):
        f = io.BytesIO()
        np.lib.format.write_array(f, np.asfortranarray(np.zeros((2, 3), np.int32)), version)
        f.seek(0)
        assert read_npy_header(f, "f", "x") == ((2, 3), np.dtype(np.int32), True, 6)
    f = io.BytesIO()
    np.lib.format.write_array(f, np.zeros(2, np.int8), (3, 0))
    f.seek(0)
    assert refusal(read_npy_header, f, "f", "x") == (
        "f",
        "x",
        "not a readable .npy array: ValueError: .npy format version 3.0 is not read here",
    )
    file, field, reason = refusal(read_npy_header, io.BytesIO(b"garbage!" * 4), "f", "x")
    assert (file, field) == ("f", "x")
    assert reason.startswith("not a readable .npy array: ValueError: ")
    f = io.BytesIO()
    np.save(f, np.zeros(2, [("a", "<i4")]))
    f.seek(0)
    assert refusal(read_npy_header, f, "f", "x") == (
        "f",
        "x",
        "dtype [('a', '<i4')] is not plain numbers or text",
    )


# -- the FLAME-MoE file ------------------------------------------------------------------------


def flame_arrays(**change) -> dict:
    """A FLAME-MoE excerpt by hand: 4 experts, top-3; prefill 6 tokens of 2 layers in
    sequences of 3; decode 2 sequences of 3 positions.  Token t, layer l routes to
    (t + l, t + l + 1, t + l + 2) mod 4."""
    t = np.arange(6)[:, None, None] + np.arange(2)[None, :, None] + np.arange(3)[None, None]
    e = (t % 4).astype(np.int64)
    arrays = {
        "num_experts": np.asarray(4),
        "prefill_topk_experts": e,
        "prefill_topk_scores": e / 8.0,
        "prefill_token_ids": np.arange(100, 106),
        "prefill_sequence_length": np.asarray(3),
        "decode_topk_experts": e.reshape(2, 3, 2, 3),
        "decode_topk_scores": e.reshape(2, 3, 2, 3) / 4.0,
        "decode_token_ids": np.arange(200, 206).reshape(2, 3),
        "top_k": np.asarray(3),
    }
    arrays.update(change)
    return {k: v for k, v in arrays.items() if v is not None}


def flame(tmp_path, part="prefill", **change):
    from fsedp.trace.core import load_flame

    p = tmp_path / "f.npz"
    np.savez(p, **flame_arrays(**change))
    return load_flame(p, part)


def test_flame_prefill_and_decode_by_hand(tmp_path):
    e = flame_arrays()["prefill_topk_experts"]
    for part, sc, ids in (("prefill", 8.0, 100), ("decode", 4.0, 200)):
        t = flame(tmp_path, part)
        assert t.name == f"f:{part}" and t.num_experts == 4
        assert t.experts.tolist() == e.tolist()
        assert t.scores.tolist() == (e / sc).tolist()
        assert t.token_ids.tolist() == list(range(ids, ids + 6))
        assert t.request.tolist() == [0, 0, 0, 1, 1, 1]
        assert t.position.tolist() == [0, 1, 2, 0, 1, 2]


def test_flame_decode_of_more_sequences_than_positions(tmp_path):
    """3 sequences of 2 positions: token s * 2 + p is request s, position p."""
    e = flame_arrays()["prefill_topk_experts"]
    t = flame(
        tmp_path,
        "decode",
        decode_topk_experts=e.reshape(3, 2, 2, 3),
        decode_topk_scores=np.zeros((3, 2, 2, 3)),
        decode_token_ids=np.arange(6).reshape(3, 2),
    )
    assert t.request.tolist() == [0, 0, 1, 1, 2, 2] and t.position.tolist() == [0, 1, 0, 1, 0, 1]
    assert t.experts.tolist() == e.tolist()


def test_flame_at_the_edges_of_its_scalars(tmp_path):
    """One expert at top-1; 4096 experts; a count stored as a one-value vector."""
    import warnings

    one = np.zeros((6, 2, 1), np.int64)
    t = flame(
        tmp_path,
        num_experts=np.asarray(1),
        prefill_topk_experts=one,
        prefill_topk_scores=one * 1.0,
        top_k=np.asarray(1),
    )
    assert t.num_experts == 1 and t.top_k == 1
    assert flame(tmp_path, num_experts=np.asarray(4096)).num_experts == 4096
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flame(tmp_path, num_experts=np.array([4])).num_experts == 4
    assert flame(tmp_path, top_k=None).top_k == 3


def test_flame_refuses_by_name(tmp_path):
    from fsedp.trace.core import load_flame

    p = str(tmp_path / "f.npz")
    e = flame_arrays()["prefill_topk_experts"]
    cases = [
        ({}, "x", "part", "must be 'prefill' or 'decode', not 'x'"),
        (
            {"num_experts": np.asarray(4097)},
            "prefill",
            "num_experts",
            "must be in 1..4096, not 4097",
        ),
        (
            {"num_experts": np.asarray(0)},
            "prefill",
            "num_experts",
            "must be a positive integer scalar, not 0",
        ),
        (
            {"num_experts": np.asarray(4.0)},
            "prefill",
            "num_experts",
            "must be a positive integer scalar, not float64 shape ()",
        ),
        (
            {"num_experts": np.arange(2)},
            "prefill",
            "num_experts",
            "must be a positive integer scalar, not int64 shape (2,)",
        ),
        (
            {"num_experts": np.asarray(2)},
            "prefill",
            "prefill_topk_experts",
            "top-k = 3 exceeds num_experts = 2",
        ),
        (
            {"num_experts": np.asarray(2)},
            "decode",
            "decode_topk_experts",
            "top-k = 3 exceeds num_experts = 2",
        ),
        # the experts' shape is checked first, before the other arrays
        (
            {"num_experts": np.asarray(2), "prefill_token_ids": np.arange(5)},
            "prefill",
            "prefill_topk_experts",
            "top-k = 3 exceeds num_experts = 2",
        ),
        (
            {"prefill_topk_experts": e[:, :, 0]},
            "prefill",
            "prefill_topk_experts",
            "must be 3-D [tokens, layers, k], not shape (6, 2)",
        ),
        (
            {"prefill_sequence_length": np.asarray(4)},
            "prefill",
            "prefill_sequence_length",
            "4 does not divide the 6 tokens of prefill_topk_experts",
        ),
        (
            {"prefill_token_ids": np.arange(5)},
            "prefill",
            "prefill_token_ids",
            "must have shape (6,), not (5,)",
        ),
        (
            {"decode_topk_experts": e},
            "decode",
            "decode_topk_experts",
            "must be 4-D [sequences, positions, layers, k], not shape (6, 2, 3)",
        ),
        (
            {"decode_token_ids": np.arange(6).reshape(3, 2)},
            "decode",
            "decode_token_ids",
            "must have shape (2, 3), not (3, 2)",
        ),
        (
            {"prefill_topk_scores": np.zeros((6, 2, 2))},
            "prefill",
            "prefill_topk_scores",
            "shape (6, 2, 2) differs from prefill_topk_experts (6, 2, 3)",
        ),
        (
            {"top_k": np.asarray(2)},
            "prefill",
            "top_k",
            "2 differs from the last axis of prefill_topk_experts (3)",
        ),
        # the trace's own checks, named after the file's arrays
        (
            {"prefill_topk_experts": e + 2},
            "prefill",
            "prefill_topk_experts",
            "expert ids must be in 0..3, found 2..5",
        ),
        (
            {"prefill_topk_scores": np.full(e.shape, np.inf)},
            "prefill",
            "prefill_topk_scores",
            "must be finite",
        ),
        (
            {"prefill_token_ids": np.arange(-1, 5)},
            "prefill",
            "prefill_token_ids",
            "must be >= 0, found -1",
        ),
        (
            {"decode_token_ids": -np.ones((2, 3), int)},
            "decode",
            "decode_token_ids",
            "must be >= 0, found -1",
        ),
    ]
    for change, part, field, reason in cases:
        np.savez(p, **flame_arrays(**change))
        assert refusal(load_flame, p, part) == (p, field, reason), change


def test_flame_names_what_is_missing(tmp_path):
    from fsedp.trace.core import load_flame

    p = str(tmp_path / "f.npz")
    np.savez(p)
    assert refusal(load_flame, p) == (p, "num_experts", "missing array (the file has: none)")
    np.savez(p, **flame_arrays(prefill_topk_scores=None, decode_topk_experts=None, top_k=None))
    assert refusal(load_flame, p) == (
        p,
        "prefill_topk_scores",
        "missing array (the file has: decode_token_ids, decode_topk_scores, num_experts, "
        "prefill_sequence_length, prefill_token_ids, prefill_topk_experts)",
    )
    np.savez(p, **flame_arrays(prefill_sequence_length=None))
    assert refusal(load_flame, p)[:2] == (p, "prefill_sequence_length")


def test_flame_caps_members_and_entries(tmp_path):
    """A member larger than a trace's cap is refused from the zip's directory; a decode
    shape of more entries than a trace file holds (4097 x 4096 x 1 x 1 > 2^24), from its
    header."""
    from fsedp.trace.core import MAX_ENTRIES, TRACE_MEMBER_BYTES, load_flame

    p = tmp_path / "f.npz"
    np.savez(p, **flame_arrays())
    patched(p, "num_experts.npy", usize=TRACE_MEMBER_BYTES + 1)
    assert refusal(load_flame, p) == (
        str(p),
        "num_experts",
        f"declares {TRACE_MEMBER_BYTES + 1} bytes uncompressed; an array of a trace file holds "
        f"at most {TRACE_MEMBER_BYTES}",
    )
    one = np.zeros((4097, 4096, 1, 1), np.int8)
    np.savez_compressed(p, **flame_arrays(decode_topk_experts=one, top_k=None))
    n = 4097 * 4096
    assert refusal(load_flame, p, "decode") == (
        str(p),
        "decode_topk_experts",
        f"shape ({n}, 1, 1) is {n} (token, layer, expert) entries; a trace file holds at most "
        f"{MAX_ENTRIES}",
    )


def test_a_trace_made_in_memory_is_not_capped_like_a_file():
    """2^24 + 65,536 entries (257 tokens of 1024 layers at top-64): more than a trace file
    may declare, taken from memory."""
    e = np.broadcast_to(np.arange(64, dtype=np.int16), (257, 1024, 64))
    t = made(e, num_experts=64)
    assert t.experts.shape == (257, 1024, 64) and t.experts.size > 1 << 24
