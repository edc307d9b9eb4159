from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.layouts import key_layout
from fsedp.params import SchedulerParams
from fsedp.sw.sorter import SORTERS, network, shuffle_lane

__all__ = ["Sorter"]

# roles of a lane in one step of an iterative network
_KEEP, _WIN, _LOSE = 0, 1, 2


def _first(x, y):
    """``x`` goes before ``y``: higher count, then lower id (ids are unique) -- one unsigned
    comparison of ``{count, ~id}``."""
    return Cat(~x.id, x.count) > Cat(~y.id, y.count)


class Sorter(wiring.Component):
    """The scheduler's sorter: keys ``(count, id, traj)`` in descending count, ties to the
    lower id; ``traj`` (the expert's trajectory mask) rides along.  Lane 0 of the output
    holds the hottest expert.

    Every variant executes the network of :func:`fsedp.sw.sorter.network`, the description
    the golden model applies step by step (``docs/blocks/sorter.md``):

    ``parallel``
        One compare-exchange stage per network stage, a register after each: latency
        ``S = log2(N)(log2(N)+1)/2`` cycles, a new vector every cycle.
    ``stage``
        One reused stage: each lane picks its partner of the current stage through a
        ``log2(N)``:1 multiplexer; ``S`` cycles, one vector at a time.
    ``shuffle``, ``shuffle2``
        A fixed perfect shuffle and ``N/2`` comparators between lanes ``2q`` and ``2q+1``,
        one or two such steps per cycle; the per-pair controls (keep, even wins, odd wins)
        come from a table indexed by the cycle count.  ``log2(N)^2 - log2(N) + 1`` steps.

    Parameters
    ----------
    p : SchedulerParams
        ``sorter_lanes`` (``E`` padded to a power of two), ``count_width``, ``chiplets`` and
        ``sorter`` (the default variant) set the size.
    kind : str, optional
        A variant other than ``p.sorter``.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(key, N)))
        Unsorted keys.
    o : Out(stream.Signature(ArrayLayout(key, N)))
        Sorted keys.  A vector held at the output stays valid and stable until ``o.ready``
        (the scheduler reads it in place).

    Latency: :attr:`latency` cycles: a vector transferred on ``i`` in cycle 0 is on ``o``
    (``o.valid``) from cycle ``latency`` (``Network.cycles``).  Throughput: ``parallel``
    one vector per cycle (it stalls as a whole while ``o.valid & ~o.ready``); the others
    one vector per ``latency`` cycles (``i.ready`` is low while a vector is being sorted or
    waits at the output).
    """

    def __init__(self, p: SchedulerParams, kind: str | None = None):
        kind = p.sorter if kind is None else kind
        if kind not in SORTERS:
            self._MustUse__silence = True
            raise ValueError(f"sorter must be one of {', '.join(SORTERS)}, not {kind!r}")
        self.p = p
        self.kind = kind
        self.lanes = p.sorter_lanes
        self.network = network(self.lanes, kind)
        vec = data.ArrayLayout(key_layout(p), self.lanes)
        super().__init__({"i": In(stream.Signature(vec)), "o": Out(stream.Signature(vec))})

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a vector on ``i`` (cycle 0) to the first cycle of
        ``o.valid``: the network's ``cycles`` (a register per stage, or per step of the
        iterative variants)."""
        return self.network.cycles

    def elaborate(self, platform):
        m = Module()
        if self.kind == "parallel":
            self._parallel(m)
        else:
            self._iterative(m)
        return m

    def _parallel(self, m):
        vec = data.ArrayLayout(key_layout(self.p), self.lanes)
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]
        lanes, valid = self.i.payload, self.i.valid
        for s, step in enumerate(self.network.steps):
            regs = Signal(vec, name=f"stage{s}")
            regs_valid = Signal(name=f"stage{s}_valid")
            with m.If(advance):
                m.d.sync += regs_valid.eq(valid)
                for a, b in step.pairs:
                    x, y = lanes[a], lanes[b]
                    keep = _first(x, y)
                    m.d.sync += [regs[a].eq(Mux(keep, x, y)), regs[b].eq(Mux(keep, y, x))]
            lanes, valid = regs, regs_valid
        m.d.comb += [self.o.payload.eq(lanes), self.o.valid.eq(valid)]

    def _tables(self, sub: int):
        """Per lane of sub-step ``sub``: its partner candidates and, per cycle, the role and
        the index of the partner among the candidates."""
        net, N = self.network, self.lanes
        k, T = net.per_cycle, net.cycles
        cands = [[] for _ in range(N)]
        rows = []  # rows[c][i] = (role, candidate index)
        for c in range(T):
            s = c * k + sub
            row = [(_KEEP, 0)] * N
            if s < len(net.steps):
                for a, b in net.steps[s].pairs:
                    for lane, other, role in ((a, b, _WIN), (b, a, _LOSE)):
                        if other not in cands[lane]:
                            cands[lane].append(other)
                        row[lane] = (role, cands[lane].index(other))
            rows.append(row)
        return cands, rows

    def _iterative(self, m):
        p, net, N = self.p, self.network, self.lanes
        vec = data.ArrayLayout(key_layout(p), N)
        T = net.cycles
        bits = N.bit_length() - 1
        regs = Signal(vec)
        busy = Signal()
        full = Signal()
        cnt = Signal(range(max(T, 1)))
        accept = Signal()
        m.d.comb += [
            self.i.ready.eq(~busy & (~full | self.o.ready)),
            accept.eq(self.i.valid & self.i.ready),
            self.o.valid.eq(full),
            self.o.payload.eq(regs),
        ]
        # the first cycle's steps apply to the input as it is loaded
        cur = Signal(vec, name="step_in")
        m.d.comb += cur.eq(Mux(busy, regs.as_value(), self.i.payload.as_value()))
        shuffled = all(st.shuffle for st in net.steps)
        for sub in range(net.per_cycle):
            if shuffled:
                src = Signal(vec, name=f"shuffled{sub}")
                for i in range(N):
                    m.d.comb += src[shuffle_lane(i, bits)].eq(cur[i])
            else:
                src = cur
            cands, rows = self._tables(sub)
            # per lane: its (role, partner choice) field of the control table
            widths = [2 + max(1, (len(cs) - 1).bit_length()) for cs in cands]
            offsets = [sum(widths[:i]) for i in range(N)]
            ctl = Signal(sum(widths), name=f"ctl{sub}")  # the table, read by cycle count
            with m.Switch(cnt):
                for c, row in enumerate(rows):
                    with m.Case(c):
                        value = sum(
                            (role | idx << 2) << offsets[i] for i, (role, idx) in enumerate(row)
                        )
                        m.d.comb += ctl.eq(Const(value, len(ctl)))
            nxt = Signal(vec, name=f"step{sub}")
            for i in range(N):
                field = ctl[offsets[i] : offsets[i] + widths[i]]
                role, sel = field[:2], field[2:]
                x = src[i]
                if not cands[i]:
                    m.d.comb += nxt[i].eq(x)
                    continue
                fixed_pair = cands[i] == [i ^ 1] and cands[i ^ 1] == [i]
                if fixed_pair and i & 1:
                    continue  # the even lane of a fixed pair drives both lanes
                partner = src[cands[i][0]].as_value()  # the stage's partner (a chain)
                for j, other in enumerate(cands[i][1:], 1):
                    partner = Mux(sel == j, src[other].as_value(), partner)
                y = Signal(key_layout(p), name=f"partner{sub}_{i}")
                xw = Signal(name=f"first{sub}_{i}")
                swap = Signal(name=f"swap{sub}_{i}")
                m.d.comb += [
                    y.eq(partner),
                    xw.eq(_first(x, y)),
                    # lane i is the winner's lane and x loses, or the loser's and x wins
                    swap.eq(((role == _WIN) & ~xw) | ((role == _LOSE) & xw)),
                    nxt[i].eq(Mux(swap, y, x)),
                ]
                if fixed_pair:
                    # a fixed pair (shuffle-exchange): one comparator, one swap for both
                    m.d.comb += nxt[i ^ 1].eq(Mux(swap, x, y))
            cur = nxt
        with m.If(self.o.ready):
            m.d.sync += full.eq(0)
        with m.If(accept):
            if T == 0:
                m.d.sync += [regs.eq(self.i.payload), full.eq(1)]
            else:
                m.d.sync += [regs.eq(cur), cnt.eq(1 % T)]
                m.d.sync += (full if T == 1 else busy).eq(1)
        with m.Elif(busy):
            m.d.sync += [regs.eq(cur), cnt.eq(cnt + 1)]
            with m.If(cnt == T - 1):
                m.d.sync += [busy.eq(0), full.eq(1), cnt.eq(0)]
