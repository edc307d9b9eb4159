"""Hypothesis strategies that reach the rules' edges on purpose -- counts at their width's
limit, full buffers and the top hop class, ties in every choice, timers at zero and at
their top -- rather than random layers, which rarely get there.  Each property states what
the rule must give at the edge it was drawn at."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from fsedp.params import SchedulerParams
from fsedp.sw.eit import EIT, GateRecord
from fsedp.sw.scheduler import Scheduler
from fsedp.sw.streaming.ring_buffer import Room, Slot
from fsedp.sw.token_buffer import TokenBuffer

SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(
    width=st.integers(1, 4),
    offset=st.sampled_from([-1, 0, 1, 2]),
    chiplets=st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
    bulk=st.booleans(),
)
def test_an_eit_count_at_its_width(width, offset, chiplets, bulk):
    """count_max + offset records of one (request, expert): the count saturates at
    count_max, the flag rises exactly when a record finds it full."""
    p = SchedulerParams(experts=8, chiplets=4, requests=2, count_width=width, theta_min=0)
    n = max(1, p.count_max + offset)
    recs = [GateRecord(1, chiplets[k % len(chiplets)], 6) for k in range(n)]
    eit = EIT(p)
    if bulk:
        eit.write_many(recs)
    else:
        for r in recs:
            eit.write(r)
    assert eit.count[1][6] == min(n, p.count_max)
    assert eit.overflow is (n > p.count_max)
    assert eit.saturated == ({"entry"} if n > p.count_max else set())
    assert eit.mask[1][6] == sum(1 << c for c in set(chiplets[: min(n, len(chiplets))]))


@SETTINGS
@given(
    t=st.sampled_from(["zero", "one", "top"]),
    c=st.sampled_from(["below", "at", "above"]),
    cold=st.booleans(),
    width=st.integers(1, 3),
    threshold=st.integers(1, 5),
)
def test_algorithm_2_at_its_timers_edges(t, c, cold, width, threshold):
    """One round of one request with T_QoS at 0, 1 or its top and C_fw one below, at or one
    above N_threshold (lines 2-8 of Algorithm 2)."""
    p = SchedulerParams(experts=8, chiplets=4, requests=1, qos_width=width,
                        n_threshold=threshold, theta_min=1)  # fmt: skip
    tb = TokenBuffer(p)
    t0 = {"zero": 0, "one": min(1, p.qos_max), "top": p.qos_max}[t]
    c0 = {"below": threshold - 1, "at": threshold, "above": min(threshold + 1, p.cfw_max)}[c]
    tb.t_qos[0], tb.c_fw[0] = t0, c0
    defer = tb.decide(1, int(cold))
    refill = c0 >= threshold
    t1 = min(t0 + 1, p.qos_max) if refill else t0
    if cold and t1 > 0:
        assert defer == 1 and tb.t_qos[0] == t1 - 1 and tb.c_fw[0] == 0
    else:
        assert defer == 0 and tb.t_qos[0] == t1
        assert tb.c_fw[0] == min((0 if refill else c0) + 1, p.cfw_max)


@SETTINGS
@given(
    orders=st.sampled_from([2, 4, 8]),
    tie=st.integers(0, 7),
    level=st.integers(0, 3),
)
def test_a_tie_between_ring_embeddings_goes_to_the_next_in_turn(orders, tie, level):
    """Every embedding equally loaded (level chiplets each): the choice is the next in
    turn, and the turn moves past it."""
    p = SchedulerParams(experts=8, chiplets=8, mesh_cols=4, ring_orders=orders, theta_min=0)
    s = Scheduler(p)
    s.orders = [None]
    full = (1 << level) - 1
    s.running = [full] * 8  # 8 / orders slots of each embedding, level chiplets each
    s.running_order = [k % orders for k in range(8)]
    s.next_order = tie % orders
    assert s.ring_order(0) == tie % orders
    assert s.next_order == (tie % orders + 1) % orders


def _room(rule, claims, slots, top):
    p = SimpleNamespace(slots=slots, held_claim=top, admission=rule)
    chip = SimpleNamespace(
        slots=[Slot(busy=True, claim=k) for k in claims]
        + [Slot() for _ in range(slots - len(claims))]
    )
    return Room(SimpleNamespace(p=p, chips=[chip], admission=True))


@SETTINGS
@given(
    top=st.integers(2, 6),
    extra=st.integers(0, 4),
    free=st.sampled_from([0, 1, 2, "r", "r+1"]),
    data=st.data(),
)
def test_admission_at_full_buffers_and_the_top_hop_class(top, extra, free, data):
    """Buffers with 0, 1, 2, r or r + 1 free slots, claims up to the top hop class (a held
    micro-slice's H + 1), a newcomer with r hops up to the top class."""
    slots = top + 1 + extra
    r = data.draw(st.integers(0, top))
    nfree = {"r": r, "r+1": r + 1}.get(free, free)
    nfree = min(nfree, slots)
    claims = data.draw(
        st.lists(st.integers(0, top), min_size=slots - nfree, max_size=slots - nfree)
    )
    count = _room("forward-count", claims, slots, top)
    assert count.admits(0, r) is (nfree > r)
    state = _room("forward-state", claims, slots, top)
    ladder = all(sum(k >= i for k in claims) + 1 + i <= slots for i in range(r + 1))
    assert state.admits(0, r) is ladder
    below = min(r, top - 2)
    two = all(sum(k >= i for k in claims) + 2 + i <= slots for i in range(below + 1))
    assert state.admits_load(0, r) is (ladder and two)
