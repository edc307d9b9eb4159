"""Small combinational helpers shared by the scheduler blocks."""

from amaranth import Const, Mux, Value

__all__ = ["lowest_bit", "ring_next_hops", "sat_add"]


def lowest_bit(x: Value, width: int, out_width: int) -> Value:
    """Index of the lowest set bit of ``x`` (0 when ``x`` is 0): a priority encoder."""
    result = Const(0, out_width)
    for i in reversed(range(width)):
        result = Mux(x[i], i, result)
    return result


def ring_next_hops(traj: Value, chiplets: int, out_width: int) -> list[Value]:
    """``next_hop[c]``: next chiplet of ``traj`` after ``c`` in ascending order, wrapping
    (``c`` itself for a one-chiplet ring, 0 for chiplets outside ``traj``)."""
    hops = []
    for c in range(chiplets):
        order = [(c + s) % chiplets for s in range(1, chiplets + 1)]
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
