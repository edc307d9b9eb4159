"""Hardware generics: the one source of truth shared by the golden models and the RTL.

``configs/*.yaml`` -> :func:`fsedp.config.load_run` -> :class:`SchedulerParams` and
:class:`DatapathParams` -> both ``fsedp.sw`` (golden models) and ``fsedp.hw`` (Amaranth
generics).  Nothing else defines a width or a depth.  Every generic is declared once with its
range (:func:`fsedp.fields.spec`) and checked eagerly; a bad one raises
:class:`~fsedp.errors.InputError` with the file ``<params>`` and the generic's name.
"""

import functools
from dataclasses import dataclass

from amaranth.lib import enum

from fsedp.errors import InputError
from fsedp.fields import check, spec, specs

__all__ = [
    "SchedulerParams",
    "DatapathParams",
    "PARAMS",
    "BeatKind",
    "bits_for",
    "next_pow2",
    "DIRS",
    "OPPOSITE",
    "ring_after",
    "RING_ORDERS",
    "RING_PATHS",
    "ring_tables",
    "cycle_cells",
    "ADMISSION_RULES",
    "check_ring_orders",
    "mesh_position",
    "xy_direction",
    "max_hops",
    "max_hops_by_trajectories",
    "MAX_CHIPLETS",
]


#: The pseudo file of a generic's error (a caller that knows where the value came from, a
#: config or an option, re-raises it there with :meth:`InputError.at`).
PARAMS = "<params>"


class BeatKind(enum.IntEnum, shape=1):
    """Kind of a beat on the scheduler's dispatch stream (the ``kind`` field of
    :func:`fsedp.hw.layouts.dispatch_layout`, the golden model's ``Dispatch.kind``)."""

    #: start streaming the expert along its trajectory, entering at ``entry``
    DISPATCH = 0
    #: Rule 4: let chiplet ``entry`` pre-load the expert's first micro-slices
    PRELOAD = 1


def _check_all(obj):
    """Every declared generic of ``obj`` against its range."""
    for name, s in specs(type(obj)).items():
        check(PARAMS, name, s, getattr(obj, name))


def bits_for(n: int) -> int:
    """Bits needed to encode the values ``0 .. n-1`` (at least 1)."""
    return max(1, (n - 1).bit_length())


def next_pow2(n: int) -> int:
    return 1 << bits_for(n) if n > 1 else 1


#: The most chiplets of a package (an 8x8 mesh): the configs, the simulator and the RTL
#: generators take 2..64 (the scheduler 4..64).
MAX_CHIPLETS = 64

#: The ring embeddings a dispatch may choose (``SchedulerParams.ring_orders``), for each ring
#: path (:data:`RING_PATHS`, :func:`ring_tables`): four embeddings of the path on the mesh,
#: each forward and backward.  ``ring_orders`` 1 takes the first, 2 the first both ways, 4
#: the first two both ways, 8 all four both ways.
RING_ORDERS = (
    "first forward", "first backward", "second forward", "second backward",
    "third forward", "third backward", "fourth forward", "fourth backward",
)  # fmt: skip

#: The ring paths laid on the mesh (``ring_path`` of the scheduler and datapath generics,
#: :func:`ring_tables`): ``snake`` -- the chiplet numbers in ascending order (row by row,
#: boustrophedon: :func:`mesh_position`), then the column snake, and both turned by 180
#: degrees; ``cycle`` -- a closed ring over every chiplet whose every leg is one hop
#: (:func:`cycle_cells`; one leg of two hops on an odd x odd mesh, where no such ring exists),
#: then the same ring turned by 180 degrees, mirrored (transposed on a square mesh, else
#: left to right) and mirrored and turned.  A snake's closing leg crosses the mesh (``rows -
#: 1`` or more hops) and every ring of the path shares it; a cycle has none.
RING_PATHS = ("snake", "cycle")

#: Buffer admission rules of the ring buffers (``DatapathParams.admission``,
#: ``docs/blocks/datapath.md`` [D4], [D16]): forward-count and forward-state (Merlin and
#: Schweitzer's controllers, applied to micro-slices).
ADMISSION_RULES = ("forward-count", "forward-state")


@dataclass(frozen=True)
class SchedulerParams:
    """Generics of the FSE-DP hardware scheduler.

    Parameters
    ----------
    chiplets : int
        Number of compute chiplets ``C`` (4..64); the ICV, trajectory masks and completion
        masks are ``C`` bits wide.
    experts : int
        Routed experts per MoE layer ``E`` (8..256).  The sorter is padded to the next power of
        two.
    count_width : int
        Width of a token count in the EIT (1..16).  Counts saturate at ``2**count_width - 1``
        and raise the sticky ``overflow`` flag (see ``docs/blocks/eit.md``).
    requests : int
        Depth of the request table ``R`` (1..64): request ids are ``0 .. R-1``.
    theta_min : int
        Cold threshold: an expert with ``0 < n_e < theta_min`` is cold (Algorithm 2).
        ``0`` disables token buffering.
    n_threshold : int
        ``N_threshold`` of Algorithm 2, counted in rounds (one round = one MoE layer of one
        iteration) during which the request was not deferred (1..2**cfw_width-1).
    qos_width : int
        Width of the per-request QoS timer ``T_QoS`` (1..16); it saturates.
    balance : int
        0: the paired-load order (Algorithm 1).  Otherwise the *balanced* order with this
        balance point in tokens (scheduler decision 27; ablation A6): from both ends of the
        sorted list, the hottest expert while the running surplus over ``balance`` is not
        positive, else the coldest.
    entry_dispatch : bool
        A dispatch makes only its entry chiplet busy in the ICV, so experts with overlapping
        trajectories stream at once, one per entry chiplet (decision 28; ablation A6).
        ``False``: the whole trajectory, as Algorithm 1.
    sorter : str
        Sorting network of the RTL (``fsedp.sw.sorter.SORTERS``, ``docs/blocks/sorter.md``).
        Every variant gives the same order; they differ in cycles and area.
    eit_lanes : int
        Experts per EIT bank word: a deferral round re-merges this many experts per cycle
        (``docs/blocks/eit.md``).
    ring_orders : int
        Ring embeddings (:data:`RING_ORDERS`) a dispatch chooses from: 1, every ring in
        ascending snake order; 2, each expert's ring ascending or descending; 4, also the
        column snake both ways -- whichever embedding carries fewer running trajectories'
        chiplets when the expert's first beat is decided (``docs/blocks/scheduler.md``,
        link-aware trajectories).  The golden models and the compiled engine follow it; the
        RTL takes 1 (it refuses more).
    mesh_cols : int
        Columns of the mesh the chiplets are numbered on (:func:`mesh_position`), which the
        column embeddings of ``ring_orders`` 4 and the ``cycle`` path need; 0: not given.
    ring_path : str
        The ring path the embeddings follow (:data:`RING_PATHS`): ``snake`` (ascending chiplet
        numbers) or ``cycle``.  The golden models, the compiled engine and the RTL follow it
        (the RTL with ``ring_orders`` 1).
    """

    chiplets: int = spec(int, 4, MAX_CHIPLETS, default=4, doc="compute chiplets C")
    experts: int = spec(int, 8, 256, default=16, doc="routed experts per MoE layer E")
    count_width: int = spec(
        int,
        1,
        16,
        default=8,
        unit="bits",
        doc="EIT token-count width (counts saturate at 2**w - 1)",
    )
    requests: int = spec(int, 1, 64, default=8, doc="request-table depth R")
    theta_min: int = spec(
        int,
        0,
        2**16 - 1,
        default=2,
        doc="cold threshold of Algorithm 2 (0 disables token buffering; "
        "at most 2**count_width - 1)",
    )
    n_threshold: int = spec(
        int, 1, 2**16 - 1, default=4, doc="N_threshold of Algorithm 2, in rounds"
    )
    qos_width: int = spec(int, 1, 16, default=4, unit="bits", doc="QoS timer width")
    balance: int = spec(
        int, 0, 2**16 - 1, default=0, doc="balanced order's balance point (0: paired order)"
    )
    entry_dispatch: bool = spec(
        bool, default=False, doc="a dispatch makes only its entry chiplet busy"
    )
    sorter: str = spec(
        str,
        choices=("parallel", "stage", "shuffle", "shuffle2"),
        default="shuffle2",
        doc="sorting network of the RTL sorter (same order, other cycles and area)",
    )
    eit_lanes: int = spec(
        int, 1, 16, default=4, doc="experts per EIT bank word (merged per cycle on deferral)"
    )
    ring_orders: int = spec(
        int,
        1,
        len(RING_ORDERS),
        default=1,
        doc="ring embeddings a dispatch chooses from (1, 2, 4 or 8: RING_ORDERS)",
    )
    mesh_cols: int = spec(
        int,
        0,
        MAX_CHIPLETS,
        default=0,
        doc="mesh columns (0: not given; ring_orders 4, 8 and the cycle path need it)",
    )
    ring_path: str = spec(
        str, choices=RING_PATHS, default="snake", doc="ring path of the embeddings (RING_PATHS)"
    )

    def __post_init__(self):
        _check_all(self)
        if self.eit_lanes & (self.eit_lanes - 1):
            raise InputError(PARAMS, "eit_lanes", f"must be a power of two, not {self.eit_lanes}")
        check_ring_orders(self.ring_orders)
        if self.mesh_cols and self.chiplets % self.mesh_cols:
            raise InputError(
                PARAMS,
                "mesh_cols",
                f"must divide chiplets = {self.chiplets}, not {self.mesh_cols}",
            )
        if self.ring_orders > 2 and not self.mesh_cols:
            raise InputError(
                PARAMS,
                "mesh_cols",
                f"ring_orders {self.ring_orders} (other embeddings) needs the mesh columns",
            )
        if self.ring_path != "snake" and not self.mesh_cols:
            raise InputError(
                PARAMS, "mesh_cols", f"ring_path {self.ring_path} needs the mesh columns"
            )
        if self.theta_min > self.count_max:
            raise InputError(
                PARAMS,
                "theta_min",
                f"must be in 0..2**count_width - 1 = {self.count_max}, not {self.theta_min}",
            )

    # -- derived widths, used by RTL and golden model alike ------------------------------
    def ring_table(self, order: int) -> tuple:
        """``(seq, pos)`` of ring embedding ``order`` (:func:`ring_tables`) on the mesh of
        ``mesh_cols`` columns (one row when not given: the snake's ascending numbers)."""
        cols = self.mesh_cols or self.chiplets
        return ring_tables(self.chiplets // cols, cols, self.ring_path)[order]

    @property
    def chiplet_bits(self) -> int:
        return bits_for(self.chiplets)

    @property
    def expert_bits(self) -> int:
        return bits_for(self.experts)

    @property
    def request_bits(self) -> int:
        return bits_for(self.requests)

    @property
    def sorter_lanes(self) -> int:
        """Lanes of the sorter: ``E`` padded to a power of two."""
        return next_pow2(self.experts)

    @property
    def lane_id_bits(self) -> int:
        return bits_for(self.sorter_lanes)

    @property
    def count_max(self) -> int:
        return 2**self.count_width - 1

    @property
    def qos_max(self) -> int:
        return 2**self.qos_width - 1

    @property
    def cfw_width(self) -> int:
        return self.n_threshold.bit_length()

    @property
    def cfw_max(self) -> int:
        return 2**self.cfw_width - 1

    @property
    def position_bits(self) -> int:
        """Bits of a position in the paired-load order (0..E, E meaning "end")."""
        return bits_for(self.experts + 1)


# -- chiplet datapath -----------------------------------------------------------------------
#: Mesh directions of a router port, in the order of the RTL port arrays.
DIRS = ("N", "E", "S", "W")
#: Direction index -> the opposite one: output port ``d`` of a chiplet feeds input port
#: ``OPPOSITE[d]`` of its neighbour.
OPPOSITE = (2, 3, 0, 1)
_STEP = {0: (-1, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1)}


def mesh_position(c: int, cols: int) -> tuple[int, int]:
    """(row, col) of chiplet ``c``: chiplets are numbered in snake (boustrophedon) order, so
    consecutive numbers are mesh neighbours and an ascending ring is short on the mesh."""
    row, k = divmod(c, cols)
    return row, (k if row % 2 == 0 else cols - 1 - k)


def xy_direction(src: tuple[int, int], dst: tuple[int, int]) -> int:
    """Output port of XY (dimension-ordered) routing: columns first, then rows."""
    (r, c), (r2, c2) = src, dst
    if c2 > c:
        return 1
    if c2 < c:
        return 3
    return 2 if r2 > r else 0


def ring_after(traj: int, c: int, n: int, seq, pos) -> int:
    """The chiplet after ``c`` in ring order among the members of ``traj`` (a bit mask over
    ``n`` chiplets): Rule 4's next DDR target and a station's next ring leg.  The ring's
    embedding is the chiplet sequence ``seq`` (``pos[c]``: ``c``'s place in it), one of
    :func:`ring_tables`.  Written once in plain Python so that the compiled engine compiles
    this very function (``fsedp.sim.fast_kernel.ring_after``, on rows of an array); the
    RTL's is ``fsedp.hw.common.ring_after``."""
    q = pos[c]
    for s in range(1, n + 1):
        m = seq[(q + s) % n]
        if traj >> m & 1:
            return m
    raise ValueError("empty trajectory")


def cycle_cells(rows: int, cols: int) -> list[tuple[int, int]]:
    """The ``cycle`` ring path (:data:`RING_PATHS`) as mesh cells ``(row, col)``: along row 0,
    then back and forth over columns ``1 ..`` of the other rows, then up column 0 -- every
    leg one hop when ``rows`` is even (a mesh with an odd ``rows`` and even ``cols`` takes the
    transposed ring); on an odd x odd mesh the last two rows go column by column and one leg
    of column 0 takes two hops.  A mesh of one row or column is its own snake."""
    if rows % 2 and cols % 2 == 0:
        return [(r, c) for c, r in cycle_cells(cols, rows)]
    if rows == 1 or cols == 1:
        return [(r, c) for r in range(rows) for c in range(cols)]
    seq = [(0, c) for c in range(cols)]
    last = rows if rows % 2 == 0 else rows - 2  # rows laid back and forth
    for i, r in enumerate(range(1, last)):
        seq += [(r, c) for c in (range(cols - 1, 0, -1) if i % 2 == 0 else range(1, cols))]
    if rows % 2 == 0:
        return seq + [(r, 0) for r in range(rows - 1, 0, -1)]
    for j, c in enumerate(range(cols - 1, 0, -1)):  # odd x odd: the last two rows
        seq += [(r, c) for r in ((rows - 2, rows - 1) if j % 2 == 0 else (rows - 1, rows - 2))]
    return seq + [(rows - 2, 0), (rows - 1, 0)] + [(r, 0) for r in range(rows - 3, 0, -1)]


def _number(r: int, k: int, cols: int) -> int:
    """The chiplet at mesh cell ``(r, k)`` (the inverse of :func:`mesh_position`)."""
    return r * cols + (k if r % 2 == 0 else cols - 1 - k)


@functools.lru_cache(maxsize=64)
def ring_tables(rows: int, cols: int, path: str = "snake") -> tuple:
    """The eight ring embeddings of :data:`RING_ORDERS` on a ``rows x cols`` mesh for a ring
    ``path`` (:data:`RING_PATHS`), each ``(seq, pos)``: the chiplets in ring order and each
    chiplet's place in it (what :func:`ring_after` follows).  Odd orders are the even ones
    walked back -- the same chiplets, every leg on the opposite directed links."""
    n = rows * cols

    def turned(cells):  # by 180 degrees
        return [(rows - 1 - r, cols - 1 - k) for r, k in cells]

    if path == "snake":
        row = [mesh_position(c, cols) for c in range(n)]
        col = [(r if k % 2 == 0 else rows - 1 - r, k) for k in range(cols) for r in range(rows)]
        bases = (row, col, turned(row), turned(col))
    elif path == "cycle":
        cells = cycle_cells(rows, cols)
        if rows == cols:
            mirrored = [(k, r) for r, k in cells]
        else:
            mirrored = [(r, cols - 1 - k) for r, k in cells]
        bases = (cells, turned(cells), mirrored, turned(mirrored))
    else:
        raise ValueError(f"unknown ring path {path!r}; choose from {RING_PATHS}")
    out = []
    for base in bases:
        first = [_number(r, k, cols) for r, k in base]
        for seq in (first, first[::-1]):
            pos = [0] * n
            for i, c in enumerate(seq):
                pos[c] = i
            out.append((tuple(seq), tuple(pos)))
    return tuple(out)


def check_ring_orders(orders: int):
    """``ring_orders`` takes the first 1, 2, 4 or all 8 of :data:`RING_ORDERS`."""
    if orders not in (1, 2, 4, 8):
        raise InputError(PARAMS, "ring_orders", f"must be 1, 2, 4 or 8, not {orders}")


def _max_hops(rows: int, cols: int, seq: tuple) -> int:
    """Longest physical path of a micro-slice on rings laid in the chiplet sequence ``seq``
    (:func:`ring_tables`): over every trajectory and every chiplet it can be loaded on, the
    XY hops of the ring legs from there back to just before it.

    A ring visits its members in ``seq``'s order from the chiplet loaded on, wrapping at the
    end, and the path ends at the member before it: it is a cyclic subsequence of ``seq``,
    and every such subsequence is the path of the trajectory of its members loaded on its
    first.  So ``H`` is the longest such subsequence, a longest path in a DAG per start:
    ``O(n^3)``, where enumerating the ``2^n`` trajectories (:func:`max_hops_by_trajectories`,
    the reference the tests compare it with) stops being possible beyond 16 chiplets."""
    n = rows * cols
    pos = [mesh_position(c, cols) for c in range(n)]
    dist = [[abs(a[0] - b[0]) + abs(a[1] - b[1]) for b in pos] for a in pos]
    best = 0
    for s in range(n):
        order = [seq[(s + i) % n] for i in range(n)]
        longest = [0] * n  # the longest ascending path from s to order[i]
        for i in range(1, n):
            v = order[i]
            longest[i] = max(longest[k] + dist[order[k]][v] for k in range(i))
        best = max(best, max(longest))
    return best


def max_hops_by_trajectories(rows: int, cols: int, path: str = "snake") -> int:
    """:func:`max_hops` by its definition: every trajectory (``2^n`` of them, so 16 chiplets
    at most), its ring legs in ``path``'s first embedding, the longest path that leaves out
    one leg."""
    n = rows * cols
    pos = [mesh_position(c, cols) for c in range(n)]
    dist = [[abs(a[0] - b[0]) + abs(a[1] - b[1]) for b in pos] for a in pos]
    seq = ring_tables(rows, cols, path)[0][0]
    best = 0
    for traj in range(1, 1 << n):
        members = [c for c in seq if traj >> c & 1]
        legs = [dist[members[i]][members[(i + 1) % len(members)]] for i in range(len(members))]
        if len(members) > 1:
            best = max(best, sum(legs) - min(legs))
    return best


_HOPS_CACHE: dict[tuple, int] = {}


def max_hops(rows: int, cols: int, orders: int = 1, path: str = "snake") -> int:
    """``H`` of a ``rows x cols`` mesh (cached): the most physical hops any micro-slice
    travels in the first ``orders`` ring embeddings (:data:`RING_ORDERS`) of ring ``path``;
    deadlock-free streaming needs ``H + 1`` slots per chiplet.  A backward ring's paths are
    the forward ones walked back, so ``H`` is the largest of the forward embeddings'."""
    tables = ring_tables(rows, cols, path)
    best = 0
    for o in range(0, max(orders, 2), 2):
        key = (rows, cols, path, o)
        if key not in _HOPS_CACHE:
            _HOPS_CACHE[key] = _max_hops(rows, cols, tables[o][0])
        best = max(best, _HOPS_CACHE[key])
    return best


_PATH_CACHE: dict = {}
_GEOMETRY_CACHE: dict = {}


def _geometry(rows: int, cols: int):
    """Neighbour and XY-direction tables of a mesh (computed once per shape)."""
    key = (rows, cols)
    if key not in _GEOMETRY_CACHE:
        n = rows * cols
        pos = [mesh_position(c, cols) for c in range(n)]
        nb = []
        for c in range(n):
            row = []
            for d in range(4):
                r, k = pos[c][0] + _STEP[d][0], pos[c][1] + _STEP[d][1]
                if 0 <= r < rows and 0 <= k < cols:
                    row.append(r * cols + (k if r % 2 == 0 else cols - 1 - k))
                else:
                    row.append(None)
            nb.append(row)
        dirs = [[xy_direction(pos[a], pos[b]) for b in range(n)] for a in range(n)]
        _GEOMETRY_CACHE[key] = (nb, dirs)
    return _GEOMETRY_CACHE[key]


@dataclass(frozen=True)
class DatapathParams:
    """Generics of the chiplet datapath (micro-slice ring buffers, routers, DDR controller).

    Parameters
    ----------
    rows, cols : int
        Mesh of ``rows x cols`` chiplets (2..64 chiplets), numbered in snake order
        (:func:`mesh_position`).
    experts : int
        Expert ids ``0 .. experts-1`` (as in :class:`SchedulerParams`).
    count_width : int
        Width of a per-chiplet token count (the compute model's table).
    slots : int
        Micro-slice slots ``K`` of each chiplet's ring buffer.  Deadlock freedom needs
        ``K >= max_hops + 1`` (see ``docs/blocks/datapath.md``); pre-loads need one more.
    micro_slices : int
        Micro-slices per expert ``M`` (1..256).
    cycles_per_token : int
        Compute cycles of one micro-slice per token held on the chiplet for that expert.
    link_cycles : int
        Cycles a die-to-die link is busy with one micro-slice (its size over the link
        bandwidth); also the hop latency.
    ddr_interval : int
        DDR issues at most one micro-slice load every ``ddr_interval`` cycles (bandwidth).
    ddr_latency : int
        Cycles from a DDR load's issue to its delivery into the reserved slot.
    preload_entries : int
        Rule 4 pre-loads the DDR controller can track at once (0 disables pre-loading; a
        pre-load beat that finds no free entry is dropped, which only costs its head start).
    rule5 : bool
        Rule 5: a dispatched expert's DDR loads go to the trajectory chiplet with the most
        free slots instead of the next one in ring order (Rule 4's striping).
    ddr_channels : int
        1: one package-level DDR controller issuing every ``ddr_interval`` cycles;
        ``rows * cols``: one channel per chiplet, each issuing every ``ddr_interval`` cycles
        into its own chiplet, remote loads included (the simulator's chips;
        ``docs/blocks/datapath.md`` [D8], [D10]).
    preempt : bool
        A compute unit switches to a present micro-slice whose computation is shorter than
        what is left of the current one; the preempted one resumes later where it stopped
        (``docs/blocks/datapath.md`` [D11]).
    hot_window : int
        A *compute-heavy* running expert (one micro-slice takes longer to compute on some
        chiplet of its trajectory than a DDR interval) may have at most this many
        micro-slices loaded and not yet retired; 0: no limit ([D12]).
    slice_table : bool
        A per-expert table of micro-slice counts ``1 .. micro_slices`` in the DDR
        controller, written before a layer like the token tables: an expert streams only
        the micro-slices of the sub-experts its tokens selected (MoE-Prism on the chip,
        ``docs/codesign.md`` [D13]).  Without it every expert streams ``micro_slices``.
    admission : str
        Which micro-slices a ring buffer admits (:data:`ADMISSION_RULES`,
        ``docs/blocks/datapath.md``): ``forward-count`` [D4], one with ``r`` hops to go while
        more than ``r`` slots are free; ``forward-state`` [D16], while for every ``i <= r``
        the slots claimed by micro-slices with at least ``i`` hops to go, it included, leave
        ``i`` free.  Both are deadlock-free with ``K >= H + 1``; the second admits more.  The
        golden model, the compiled engine and the RTL take both.
    ring_orders : int
        Ring embeddings the stations, DDR striping and admission follow
        (:data:`RING_ORDERS`: 1, 2, 4 or 8, as ``SchedulerParams.ring_orders``); a beat of
        another is malformed.  ``H`` is the longest path over the embeddings followed
        (:func:`max_hops`).  The RTL takes 1.
    ring_path : str
        The ring path of those embeddings (:data:`RING_PATHS`, as
        ``SchedulerParams.ring_path``).  The RTL takes both (its first embedding).
    """

    rows: int = spec(int, 1, 16, default=2, doc="mesh rows")
    cols: int = spec(int, 1, 16, default=2, doc="mesh columns")
    experts: int = spec(int, 1, 256, default=16, doc="expert ids 0..experts-1")
    count_width: int = spec(int, 1, 16, default=6, unit="bits", doc="per-chiplet token count")
    slots: int = spec(int, 2, 256, default=6, doc="micro-slice slots K per ring buffer")
    micro_slices: int = spec(int, 1, 256, default=4, doc="micro-slices per expert M")
    cycles_per_token: int = spec(
        int, 1, 2**24, default=1, unit="cycles", doc="compute of one micro-slice per token"
    )
    link_cycles: int = spec(
        int,
        1,
        2**24,
        default=2,
        unit="cycles",
        doc="D2D link occupancy and hop latency of one micro-slice",
    )
    ddr_interval: int = spec(
        int, 1, 2**24, default=2, unit="cycles", doc="DDR issue interval per channel"
    )
    ddr_latency: int = spec(int, 1, 2**24, default=8, unit="cycles", doc="DDR issue to delivery")
    preload_entries: int = spec(int, 0, 16, default=2, doc="Rule 4 pre-loads tracked at once")
    rule5: bool = spec(bool, default=False, doc="Rule 5 DDR targeting")
    ddr_channels: int = spec(int, 1, MAX_CHIPLETS, default=1, doc="1 or rows x cols")
    preempt: bool = spec(bool, default=False, doc="shorter micro-slices preempt the compute")
    hot_window: int = spec(
        int, 0, 256, default=0, doc="loaded, unretired micro-slices of a compute-heavy expert"
    )
    slice_table: bool = spec(bool, default=False, doc="per-expert micro-slice counts [D13]")
    admission: str = spec(
        str,
        choices=ADMISSION_RULES,
        default="forward-count",
        doc="buffer admission rule of the ring buffers ([D4], [D16])",
    )
    ring_orders: int = spec(
        int, 1, len(RING_ORDERS), default=1, doc="ring embeddings followed (1, 2, 4 or 8)"
    )
    ring_path: str = spec(
        str, choices=RING_PATHS, default="snake", doc="ring path of the embeddings (RING_PATHS)"
    )

    def __post_init__(self):
        _check_all(self)
        check_ring_orders(self.ring_orders)
        if not 2 <= self.rows * self.cols <= MAX_CHIPLETS:
            raise InputError(
                PARAMS,
                "rows",
                f"rows x cols must be 2..{MAX_CHIPLETS} chiplets, not "
                f"{self.rows} x {self.cols} = {self.rows * self.cols}",
            )
        if self.ddr_channels not in (1, self.rows * self.cols):
            raise InputError(
                PARAMS,
                "ddr_channels",
                f"must be 1 or rows x cols = {self.rows * self.cols}, not {self.ddr_channels!r}",
            )
        if self.slots < self.max_hops + 1:
            raise InputError(
                PARAMS,
                "slots",
                f"must be at least max_hops + 1 = {self.max_hops + 1} on a "
                f"{self.rows}x{self.cols} mesh (deadlock freedom), "
                f"not {self.slots}",
            )

    @classmethod
    def for_scheduler(cls, p: SchedulerParams, rows: int, cols: int, **kw) -> "DatapathParams":
        """Datapath generics consistent with a scheduler's (experts, count width, chiplets)."""
        if rows * cols != p.chiplets:
            raise InputError(
                PARAMS,
                "rows",
                f"rows x cols = {rows * cols} must equal the scheduler's chiplets = {p.chiplets}",
            )
        kw.setdefault("ring_path", p.ring_path)  # the rings the scheduler's next hops follow
        return cls(rows=rows, cols=cols, experts=p.experts, count_width=p.count_width, **kw)

    # -- derived ---------------------------------------------------------------------------
    @property
    def chiplets(self) -> int:
        return self.rows * self.cols

    @property
    def chiplet_bits(self) -> int:
        return bits_for(self.chiplets)

    @property
    def expert_bits(self) -> int:
        return bits_for(self.experts)

    @property
    def index_bits(self) -> int:
        return bits_for(self.micro_slices)

    @property
    def slot_bits(self) -> int:
        return bits_for(self.slots)

    @property
    def slice_count_bits(self) -> int:
        """Width of a micro-slice count ``1 .. micro_slices`` (the slice table's entries)."""
        return bits_for(self.micro_slices + 1)

    @property
    def free_bits(self) -> int:
        """Width of a free-slot count ``0 .. K``."""
        return bits_for(self.slots + 1)

    @property
    def max_hops(self) -> int:
        """``H``: the most physical hops any micro-slice travels (over all trajectories)."""
        return max_hops(self.rows, self.cols, self.ring_orders, self.ring_path)

    def ring_table(self, order: int) -> tuple:
        """``(seq, pos)`` of ring embedding ``order`` (:func:`ring_tables`)."""
        return ring_tables(self.rows, self.cols, self.ring_path)[order]

    @property
    def held_claim(self) -> int:
        """The hops a held micro-slice (a pre-load, one loaded ahead) counts for under
        admission: ``H + 1``, more than any path ([D4], [D16])."""
        return self.max_hops + 1

    @property
    def held_room(self) -> int:
        """Slots of a chiplet that held micro-slices (pre-loads, [D3], and ones loaded
        ahead of their layer, [D14]) may take: ``K - H - 1``, so that the ``H + 1`` free
        slots forward-count admission needs stay free."""
        return max(0, self.slots - self.held_claim)

    @property
    def ddr_age_bits(self) -> int:
        """Width of a DDR delivery queue entry's issue time stamp: wide enough that the age
        ``now - issued`` (modulo ``2**ddr_age_bits``) of any entry still queued is exact."""
        return bits_for(self.ddr_latency + 1) + 8

    @property
    def ddr_fifo_depth(self) -> int:
        """Entries of each DDR channel's delivery queue: ``ceil(ddr_latency / ddr_interval)``
        loads in flight at one issue every ``ddr_interval`` cycles, plus two entries of
        margin (``docs/blocks/datapath.md``, the bounded-storage property)."""
        return -(-self.ddr_latency // self.ddr_interval) + 2

    @property
    def hop_bits(self) -> int:
        return bits_for(self.max_hops + 2)

    @property
    def compute_bits(self) -> int:
        """Width of the compute countdown (``max(1, tokens) * cycles_per_token``)."""
        return bits_for((2**self.count_width - 1) * self.cycles_per_token + 1)

    def position(self, c: int) -> tuple[int, int]:
        return mesh_position(c, self.cols)

    def neighbour(self, c: int, d: int) -> int | None:
        """Chiplet next to ``c`` in direction ``d`` (``None`` at the mesh edge)."""
        return _geometry(self.rows, self.cols)[0][c][d]

    def distance(self, a: int, b: int) -> int:
        (r, k), (r2, k2) = self.position(a), self.position(b)
        return abs(r - r2) + abs(k - k2)

    def direction(self, src: int, dst: int) -> int:
        return _geometry(self.rows, self.cols)[1][src][dst]

    def remote_entry(self, traj: int, c: int, order: int = 0) -> tuple[int, int]:
        """Where a micro-slice of ``traj`` loaded on a chiplet ``c`` outside it enters the
        trajectory (a *remote* load): the trajectory chiplet with the shortest whole path
        (the hops to it plus its ring), ties to the lower chiplet, and that path's hops
        (cached).  The path is never longer than ``H``: it is at most the path of the
        trajectory ``traj | 1 << c`` loaded on ``c``, whose first leg leads to the ring
        successor of ``c`` and whose other legs are those of ``traj`` from there (in the
        ring's ``order``)."""
        key = ("remote", self.rows, self.cols, self.ring_path, traj, c, order)
        hit = _PATH_CACHE.get(key)
        if hit is None:
            hit = _PATH_CACHE[key] = min(
                (self.distance(c, j) + self.path_hops(traj, j, order), j)
                for j in range(self.chiplets)
                if traj >> j & 1
            )[::-1]
        return hit

    def path_hops(self, traj: int, start: int, order: int = 0) -> int:
        key = (self.rows, self.cols, self.ring_path, traj, start, order)
        h = _PATH_CACHE.get(key)
        if h is None:
            h = _PATH_CACHE[key] = self._path_hops(traj, start, order)
        return h

    def _path_hops(self, traj: int, start: int, order: int = 0) -> int:
        """Physical hops of a micro-slice of ``traj`` loaded on ``start``: every ring leg
        except the one that would return to ``start`` (in the ring's ``order``; the
        descending ring's paths are the ascending ones walked back, so ``H`` is the same)."""
        n = self.chiplets
        seq, pos = self.ring_table(order)
        total, c = 0, start
        for _ in range(bin(traj).count("1") - 1):
            nxt = ring_after(traj, c, n, seq, pos)
            total += self.distance(c, nxt)
            c = nxt
        return total
