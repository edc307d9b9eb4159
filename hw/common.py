"""Small combinational helpers shared by the scheduler blocks."""

from amaranth import Cat, Const, Mux, Value

from fsedp.params import DatapathParams

__all__ = [
    "check_chiplet",
    "first_set",
    "lowest_bit",
    "mux_tree",
    "ring_next_hops",
    "sat_add",
    "tree_sum",
    "ring_after",
    "rr_pick",
]


def check_chiplet(owner, p, chiplet: int | None = None):
    """Eager checks of a datapath component's generics (``p`` must be ``DatapathParams``,
    ``chiplet`` one of its chiplets).  A component that fails them is never elaborated, so
    Amaranth's unused-elaboratable warning is silenced for ``owner`` first."""

    def fail(exc):
        owner._MustUse__silence = True
        raise exc

    if not isinstance(p, DatapathParams):
        fail(TypeError(f"p must be DatapathParams, not {p!r}"))
    if chiplet is not None and not 0 <= chiplet < p.chiplets:
        fail(ValueError(f"chiplet must be in 0..{p.chiplets - 1}, not {chiplet}"))
    if p.ring_orders != 1:
        fail(
            ValueError(
                f"ring_orders {p.ring_orders}: the datapath RTL follows one ring embedding "
                "(ring_orders 1, either ring path); the golden model and the simulator take "
                "2, 4 and 8"
            )
        )


def lowest_bit(x: Value, width: int, out_width: int) -> Value:
    """Index of the lowest set bit of ``x`` (0 when ``x`` is 0): a priority encoder."""
    result = Const(0, out_width)
    for i in reversed(range(width)):
        result = Mux(x[i], i, result)
    return result


def _after(c: int, seq) -> list[int]:
    """The chiplets after ``c`` in the ring sequence ``seq``, ``c`` itself last."""
    n = len(seq)
    q = seq.index(c)
    return [seq[(q + s) % n] for s in range(1, n + 1)]


def ring_next_hops(traj: Value, chiplets: int, out_width: int, seq=None) -> list[Value]:
    """``next_hop[c]``: next chiplet of ``traj`` after ``c`` in the ring sequence ``seq``
    (the generics' ``ring_table(0)[0]``, the ring path's first embedding; ascending numbers
    when not given), wrapping (``c`` itself for a
    one-chiplet ring, 0 for chiplets outside ``traj``)."""
    seq = tuple(range(chiplets)) if seq is None else tuple(seq)
    hops = []
    for c in range(chiplets):
        order = _after(c, seq)
        hop = Const(0, out_width)
        for n in reversed(order):
            hop = Mux(traj[n], n, hop)
        hops.append(Mux(traj[c], hop, 0))
    return hops


def sat_add(a: Value, b: Value, limit: int) -> tuple[Value, Value]:
    """``min(a + b, limit)`` and whether it saturated."""
    s = a + b
    over = s > limit
    return Mux(over, limit, s), over


def tree_sum(terms) -> Value:
    """The sum of ``terms`` (values or ints) as a balanced tree of adders, ``ceil(log2 n)``
    deep: Python's ``sum`` builds a chain ``n - 1`` adders deep, which Yosys and ABC keep
    (measured: the EIT re-merge's sum over the requests, on the 128-expert scheduler's
    critical path).  The same value as ``sum(terms)``, at least as wide."""
    level = list(terms)
    if not level:
        return Const(0, 1)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return Value.cast(level[0])


def ring_after(traj: Value, c: int, chiplets: int, out_width: int, seq=None) -> Value:
    """Next chiplet of ``traj`` after ``c`` in the ring sequence ``seq`` (ascending numbers
    when not given), wrapping (``c`` itself when ``c`` is the only one): a priority chain in
    the sequence's order, the RTL of ``fsedp.params.ring_after`` for one embedding."""
    seq = tuple(range(chiplets)) if seq is None else tuple(seq)
    hop = Const(c, out_width)
    for n in reversed(_after(c, seq)[:-1]):
        hop = Mux(traj[n], n, hop)
    return hop


def rr_pick(eligible: list, pointer: Value, out_width: int) -> tuple[Value, Value]:
    """Round-robin arbiter: the first eligible index at or after ``pointer``, wrapping.
    Returns ``(any, index)``."""
    n = len(eligible)
    first_any = Const(0, out_width)
    after_any = Const(0, out_width)
    any_after = Const(0)
    for i in reversed(range(n)):
        first_any = Mux(eligible[i], i, first_any)
        # (a comparison that is always true for the largest index is left out: lint-clean)
        at_or_after = (pointer <= i) if i < (1 << len(pointer)) - 1 else Const(1)
        take = eligible[i] & at_or_after
        after_any = Mux(take, i, after_any)
        any_after = any_after | take
    anyv = Const(0)
    for e in eligible:
        anyv = anyv | e
    return anyv, Mux(any_after, after_any, first_any)


def first_set(bits, highest: bool = False) -> tuple[Value, Value]:
    """Priority encoder as a balanced tree (``log2`` levels of 2:1 multiplexers): whether any
    of ``bits`` (a list of 1-bit values) is set, and the index of the lowest set one (the
    highest with ``highest``); the index is 0 when none is set."""
    bits = list(bits)
    size = 1
    while size < len(bits):
        size *= 2
    level = [(b, None) for b in bits] + [(Const(0), None)] * (size - len(bits))
    while len(level) > 1:
        nxt = []
        for (a_lo, i_lo), (a_hi, i_hi) in zip(level[0::2], level[1::2]):
            pick_hi = a_hi if highest else a_hi & ~a_lo
            low = pick_hi if i_lo is None else Cat(Mux(pick_hi, i_hi, i_lo), pick_hi)
            nxt.append((a_lo | a_hi, low))
        level = nxt
    any_, index = level[0]
    return any_, Const(0, 1) if index is None else index


def mux_tree(values, index: Value) -> Value:
    """``values[index]`` as a balanced tree of 2:1 multiplexers, one level per bit of
    ``index`` (an index past the end returns the last value).  Yosys turns a variable
    ``word_select`` into a barrel shifter over the whole vector and a ``Switch`` into a
    one-hot ``$pmux``; this tree is ``len(values) - 1`` multiplexers per bit."""
    level = [Value.cast(v) for v in values]
    bit = 0
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [Mux(index[bit], hi, lo) for lo, hi in zip(level[0::2], level[1::2])]
        bit += 1
    return level[0]
