"""``fsedp rtl ...``: Verilog, cosimulation of RTL against the golden models, latency and
area reports.  Parsing and dispatch only: the options are checked here (a bad one is one
line, exit 2, before any work) and the runs and their text are
:mod:`fsedp.experiments.rtl_runs`'s."""

import dataclasses
import sys

from fsedp.cli.common import (
    CONFIG,
    JSON,
    Parser,
    emit,
    field_doc,
    field_options,
    field_value,
    int_at_least,
    load_config,
    number,
    positive,
    require_simulator,
    usage,
    write_output,
)
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.experiments import rtl_runs
from fsedp.files import build_dir
from fsedp.params import DatapathParams, SchedulerParams
from fsedp.sw.sorter import SORTERS

#: the scheduler generics the hardware commands take as options over the config's
SCHEDULER_OVERRIDES = ("experts", "chiplets", "balance", "entry_dispatch", "sorter", "eit_lanes")


def _params(args) -> SchedulerParams:
    cfg = load_config(args)
    p = cfg.scheduler_params()
    over = {
        k: getattr(args, k)
        for k in SCHEDULER_OVERRIDES
        if not any(getattr(args, k, None) is x for x in (None, False))
    }
    if over:
        try:
            p = dataclasses.replace(p, **over)
        except InputError as e:
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
    return p


def _done(args, doc: dict, text: str, ok: bool) -> int:
    """Print the outcome (text, or JSON with ``--json``); exit status 0 when it passed."""
    emit(args, doc, text)
    return 0 if ok else 1


def cmd_rounds(args):
    from fsedp.workload import rounds as run_rounds

    cfg = load_config(args)
    p = cfg.scheduler_params()
    rounds = run_rounds(cfg)
    require_simulator(args.sim)
    return _done(args, *rtl_runs.rounds(cfg, p, rounds, args.sim, args.show_rounds))


def cmd_verilog(args):
    from fsedp.hw.generate import BLOCKS, DATAPATH_BLOCKS

    p = _params(args)
    if args.lint:
        require_simulator("verilator")
    blocks = list(BLOCKS) if args.block == "all" else [args.block] if args.block in BLOCKS else []
    dp_blocks = [b for b in DATAPATH_BLOCKS if args.block in ("all", b)]
    if dp_blocks and getattr(args, "chiplets", None) is not None:
        if args.block != "all":
            raise usage(
                "--chiplets",
                f"does not apply to {args.block}; its mesh is "
                "hardware.rows x hardware.cols of the run config",
            )
        dp_blocks = []  # --chiplets reshapes the scheduler only
    dp = None
    if dp_blocks:
        dp = dataclasses.replace(load_config(args).datapath_params(), experts=p.experts)
    return _done(args, *rtl_runs.verilog(p, blocks, dp, dp_blocks, args.out, args.force, args.lint))


def cmd_cosim(args):
    p = _params(args)
    if args.top_k is not None and args.top_k > p.experts:
        raise usage("--top-k", f"must be at most the {p.experts} experts, not {args.top_k}")
    if args.tokens is not None and args.tokens > p.count_max:
        raise usage(
            "--tokens", f"must be at most 2**count_width - 1 = {p.count_max}, not {args.tokens}"
        )
    # the options' own rules before the tools: the answer must not depend on what is installed
    if args.driver == "native":
        if args.sim != "verilator":
            raise usage("--driver", f"native runs on Verilator only, not --sim {args.sim}")
        if args.waves:
            raise usage("--waves", "with --driver native a failing round records its own VCD")
    elif args.report:
        raise usage("--report", "is written by --driver native only")
    require_simulator(args.sim)
    knobs = {
        "rounds": args.rounds,
        "seed": args.seed,
        "stall": args.stall,
        "reset_every": args.reset_every,
        "tokens": args.tokens,
        "top_k": args.top_k,
    }
    if args.driver == "native":
        from fsedp.tb.native import native_missing

        why = native_missing()
        if why:
            raise usage("--driver", f"native: {why}")
        # --report was checked with the other outputs before any work (fsedp.cli.check_common)
        run = rtl_runs.cosim_native(
            p, knobs, args.report, args.build_opt, args.progress_every, quiet=args.json
        )
        return _done(args, *run)
    return _done(args, *rtl_runs.cosim(p, args.sim, knobs, args.build_opt, args.waves))


def cmd_coverage(args):
    """``fsedp rtl coverage``: functional coverage per block from checked native
    regressions, the stimulus steered at the bins still missed (:mod:`fsedp.tb.coverage`)."""
    from fsedp.tb.native import native_missing

    p = _params(args)
    why = native_missing()
    if why:
        raise usage("--build-opt", f"the native driver cannot be built here: {why}")
    run = rtl_runs.coverage(
        p, args.rounds, args.batches, args.seed, args.build_opt, quiet=args.json
    )
    return _done(args, *run)


def cmd_report(args):
    from fsedp.experiments.rtl_report import rtl_report

    base = load_config(args).scheduler_params()
    if args.count_width is not None:
        try:
            base = dataclasses.replace(base, count_width=args.count_width)
        except InputError as e:
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
    experts = [positive("--experts", 4096)(x) for x in args.experts.split(",")]
    sorters = [x for x in args.sorters.split(",") if x]
    for kind in sorters:
        if kind not in SORTERS:
            raise usage("--sorters", f"{kind[:40]!r} is not one of {', '.join(SORTERS)}")
    chiplets = [positive("--chiplets", 4096)(x) for x in args.chiplets.split(",")]
    for e in experts:
        for c in chiplets:
            try:
                dataclasses.replace(base, experts=e, chiplets=c)
            except InputError as err:
                raise err.at(COMMAND_LINE, f"--{err.field}") from None
    if not args.no_latency:
        require_simulator(args.sim)
    try:
        rows = rtl_report(
            base,
            experts,
            chiplets,
            sim=args.sim,
            cells=not args.no_cells,
            latency=not args.no_latency,
            rounds=args.rounds,
            progress=not args.json,
            sorters=sorters,
        )
    except InputError as e:
        raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
    doc = {"base_params": dataclasses.asdict(base), "rows": rows}
    command = " ".join(["fsedp", *sys.argv[1:]]) if sys.argv[1:2] == ["rtl"] else "fsedp rtl report"
    text = rtl_runs.report_page(command, args.sim, base, rows)
    if args.out:
        write_output(args.out, text)
    emit(args, doc, text)
    return 0


def _mesh(text: str, layers: int) -> tuple[int, int, int]:
    """``ROWSxCOLS[:LAYERS]``."""
    try:
        shape, _, n = text.lower().partition(":")
        r, c = (int(x) for x in shape.split("x"))
        n = int(n) if n else layers
    except ValueError:
        raise usage(
            "--mesh", f"expected ROWSxCOLS[:LAYERS] such as 2x2 or 4x4:100, not {text[:40]!r}"
        ) from None
    if not (1 <= r <= 16 and 1 <= c <= 16):
        raise usage("--mesh", f"{text[:40]}: rows and cols must be in 1..16")
    if not 1 <= n <= 10**6:
        raise usage("--mesh", f"the number of layers must be in 1..1000000, not {n}")
    return r, c, n


def cmd_datapath(args):
    from fsedp.experiments.datapath_report import (
        cells_table,
        format_markdown,
        ring_table,
        run_params,
    )

    meshes = [(_mesh(m, args.layers), m) for m in args.mesh or []]
    doc, runs = {}, []
    if args.ring:
        doc["ring"] = ring_table()
    # A6's datapath rules (--hot-window, --preempt) and the slice table ([D13]) apply to
    # the cells and to every mesh
    rules = dict(
        hot_window=args.hot_window,
        preempt=args.preempt or None,
        slice_table=args.slice_table or None,
        cycles_per_token=args.cycles_per_token,
    )
    # [D10] a DDR channel per chiplet (remote loads) on every mesh and in the cells
    channels = (lambda r, c: r * c) if args.ddr_per_chiplet else (lambda r, c: None)
    cells_params = None
    if args.cells:
        _, cells_params = run_params(2, 2, ddr_channels=channels(2, 2), **rules)
        doc["cells"] = cells_table(cells_params)
    for (r, c, layers), mesh in meshes:
        try:
            sp, p = run_params(
                r,
                c,
                slots=args.slots,
                micro_slices=args.micro_slices,
                link_cycles=args.link_cycles,
                ddr_interval=args.ddr_interval,
                ddr_latency=args.ddr_latency,
                preload_entries=args.preload,
                rule5=args.rule5 or None,
                ddr_channels=channels(r, c),
                **rules,
            )
        except InputError as e:
            if e.field in ("rows", "cols", "chiplets"):
                raise e.at(COMMAND_LINE, "--mesh", f"{mesh}: {e.field} {e.reason}") from None
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
        require_simulator(args.sim)
        res = rtl_runs.datapath_mesh(
            sp,
            p,
            layers,
            args.sim,
            args.seed,
            args.stall,
            args.reset_every,
            args.build_opt,
            args.waves,
            quiet=args.json,
        )
        res.update(
            command=f"fsedp rtl datapath --mesh {r}x{c}:{layers} "
            f"--sim {args.sim} --seed {args.seed} --stall {args.stall}"
            + (f" --reset-every {args.reset_every}" if args.reset_every else "")
            + "".join(
                f" --{k.replace('_', '-')} {v}"
                for k, v in rules.items()
                if v is not None and k not in ("preempt", "slice_table")
            )
            + (" --preempt" if args.preempt else "")
            + (" --slice-table" if args.slice_table else "")
            + (" --rule5" if args.rule5 else "")
            + (" --ddr-per-chiplet" if args.ddr_per_chiplet else ""),
        )
        runs.append(res)
    doc["runs"] = runs
    text = format_markdown(doc.get("ring"), doc.get("cells"), cells_params, runs)
    if args.out:
        write_output(args.out, rtl_runs.datapath_page(text))
    return _done(args, doc, text, rtl_runs.datapath_ok(runs))


def cmd_formal(args):
    """Bounded model checking of the blocks' formal properties (``fsedp.tb.formal``)."""
    from fsedp.tb.formal import CHECKS, missing_tools

    names = list(CHECKS) if not args.check else args.check
    for n in names:
        if n not in CHECKS:
            raise usage("--check", f"unknown check {n!r}; choose from {', '.join(CHECKS)}")
    if args.list:
        return _done(args, *rtl_runs.formal_list(names), True)
    missing = missing_tools(args.solver)
    if missing:
        raise usage(
            "--solver",
            f"formal checking needs {', '.join(missing)} on PATH (Debian: apt-get install "
            f"yosys {args.solver})",
        )
    run = rtl_runs.formal(
        names, args.out or build_dir("formal"), args.force, args.depth, args.solver, args.json
    )
    return _done(args, *run)


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    from fsedp.hw.generate import BLOCKS, DATAPATH_BLOCKS

    rtl = sub.add_parser("rtl", help="hardware: Verilog, cosimulation, latency and area report")
    rsub = rtl.add_subparsers(dest="rtl_cmd", required=True, parser_class=Parser)
    sims = ["verilator", "icarus"]
    opts = ["-O0", "-O1", "-O2"]
    stall = number("--stall", 0.0, 0.95)
    seed = int_at_least("--seed", 0, 2**32 - 1)

    rr = rsub.add_parser(
        "rounds",
        parents=[CONFIG, JSON],
        help="the run config's scheduling rounds through the scheduler RTL "
        "and its golden model, schedule printed",
    )
    rr.add_argument("--sim", default="verilator", choices=sims)
    rr.add_argument(
        "--show-rounds",
        type=int_at_least("--show-rounds", 0),
        default=1,
        metavar="N",
        help="print the full schedule of the first N rounds",
    )
    rr.set_defaults(func=cmd_rounds)

    def sizes(p):
        field_options(p, SchedulerParams, SCHEDULER_OVERRIDES)

    v = rsub.add_parser("verilog", parents=[CONFIG, JSON], help="write the Verilog of every block")
    sizes(v)
    v.add_argument("--out", required=True, help="output folder")
    v.add_argument("--block", default="all", choices=["all", *BLOCKS, *DATAPATH_BLOCKS])
    v.add_argument("--lint", action="store_true", help="also run verilator --lint-only -Wall")
    v.set_defaults(func=cmd_verilog, out_kind="folder")

    c = rsub.add_parser(
        "cosim",
        parents=[CONFIG, JSON],
        help="random scheduling rounds through RTL and golden model",
    )
    sizes(c)
    c.add_argument("--sim", default="verilator", choices=sims)
    c.add_argument("--rounds", type=positive("--rounds", 10**6), default=100, help="rounds")
    c.add_argument("--seed", type=seed, default=1, help="seed of the rounds and the stalls")
    c.add_argument("--stall", type=stall, default=0.25, help="probability of a valid/ready stall")
    c.add_argument(
        "--reset-every",
        type=int_at_least("--reset-every", 0),
        default=0,
        help="reset mid-round every N rounds",
    )
    # --tokens and --top-k unset: the testbench draws them per round (tb/scoreboard.py)
    c.add_argument(
        "--tokens", type=positive("--tokens", 4096), help="tokens per round (default: random)"
    )
    c.add_argument(
        "--top-k", type=positive("--top-k", 64), help="experts per token (default: random 1..4)"
    )
    c.add_argument(
        "--build-opt",
        default="-O2",
        choices=opts,
        help="C++ optimisation of the Verilator model: -O0 builds fastest, "
        "-O2 simulates fastest (for long runs)",
    )
    c.add_argument(
        "--waves",
        action="store_true",
        help="record every signal (Verilator: VCD, Icarus: FST); the summary names the file",
    )
    c.add_argument(
        "--driver",
        default="cocotb",
        choices=("cocotb", "native"),
        help="cocotb: the Python testbench; native: a C++ driver with the golden model "
        "checking its transfers as they stream out, ~300x faster (regressions of 10^5 rounds)",
    )
    c.add_argument(
        "--report",
        # its default depends on the sizes and the seed: no parser default
        help="native driver: JSON report, rewritten as the run goes (default build/cosim/"
        + rtl_runs.NATIVE_REPORT.format(experts="<E>", chiplets="<C>", seed="<S>")
        + ")",
    )
    c.add_argument(
        "--progress-every",
        type=number("--progress-every", 0.1, 3600),
        default=10.0,
        help="native driver: seconds between progress lines and report updates",
    )
    c.set_defaults(func=cmd_cosim)

    cv = rsub.add_parser(
        "coverage",
        parents=[CONFIG, JSON],
        help="functional coverage per block from checked regressions (native driver)",
    )
    sizes(cv)
    cv.add_argument(
        "--rounds", type=positive("--rounds", 10**6), default=2000, help="rounds per batch"
    )
    cv.add_argument(
        "--batches",
        type=positive("--batches", 100),
        default=8,
        help="at most this many batches, each steered at the bins still missed",
    )
    cv.add_argument("--seed", type=seed, default=1)
    cv.add_argument("--build-opt", default="-O2", choices=opts)
    cv.set_defaults(func=cmd_coverage)

    r = rsub.add_parser(
        "report", parents=[CONFIG, JSON], help="scheduling latency and Yosys cell counts"
    )
    r.add_argument("--experts", default="16,32,64,128,256")
    r.add_argument("--chiplets", default="4,9,16")
    r.add_argument("--sim", default="verilator", choices=sims)
    r.add_argument(
        "--rounds",
        type=positive("--rounds", 10**4),
        default=6,
        help="rounds simulated per size for latency",
    )
    r.add_argument("--no-cells", action="store_true")
    r.add_argument("--no-latency", action="store_true")
    r.add_argument(
        "--count-width",
        type=positive("--count-width", 4096),
        help="EIT count width (default: the config's; the first generation was measured at 10)",
    )
    r.add_argument(
        "--sorters",
        default="",
        help="comma-separated sorter variants to measure beside the config's "
        f"({', '.join(SORTERS)}; cells only)",
    )
    r.add_argument("--out", help="also write the table (Markdown) to this file")
    r.set_defaults(func=cmd_report, out_kind="file")

    f = rsub.add_parser(
        "formal",
        parents=[JSON],
        help="formal properties of the scheduler blocks: bounded model checking (yosys-smtbmc)",
    )
    f.add_argument(
        "--check", action="append", help="a check (repeatable; default: all); --list names them"
    )
    f.add_argument("--list", action="store_true", help="list the checks and their properties")
    f.add_argument(
        "--depth",
        type=int_at_least("--depth", 1, 200),
        help="BMC depth in cycles (default: each check's stated depth)",
    )
    f.add_argument("--solver", default="z3", choices=["z3", "yices", "boolector"])
    f.add_argument("--out", help="work folder (Verilog, SMT-LIB, counterexample VCDs)")
    f.set_defaults(func=cmd_formal, out_kind="folder")

    d = rsub.add_parser(
        "datapath",
        parents=[JSON],
        help="chiplet datapath: ring streaming time, cells, long random cosimulation",
    )
    d.add_argument("--no-ring", dest="ring", action="store_false")
    d.add_argument("--no-cells", dest="cells", action="store_false")
    d.add_argument(
        "--mesh", action="append", help="cosimulate this mesh, ROWSxCOLS[:LAYERS] (repeatable)"
    )
    d.add_argument(
        "--layers",
        type=positive("--layers", 10**6),
        default=100,
        help="layers of a --mesh without :LAYERS",
    )
    d.add_argument("--sim", default="verilator", choices=sims)
    d.add_argument("--seed", type=seed, default=1)
    d.add_argument(
        "--stall",
        type=stall,
        default=0.25,
        help="probability of a stall per link, DDR, dispatch and done each cycle",
    )
    d.add_argument("--reset-every", type=int_at_least("--reset-every", 0), default=0)
    # unset, a generic takes the value of a small, fast random cosimulation (run_params)
    dp_default = "the random cosimulation's"
    field_options(d, DatapathParams, ("slots", "micro_slices", "link_cycles"), dp_default)
    field_options(d, DatapathParams, ("ddr_interval", "ddr_latency"), dp_default)
    d.add_argument(
        "--preload",
        type=field_value(DatapathParams, "preload_entries", "--preload"),
        help=f"{field_doc(DatapathParams, 'preload_entries')} (default: {dp_default})",
    )
    field_options(d, DatapathParams, ("hot_window", "cycles_per_token"), dp_default)
    d.add_argument("--rule5", action="store_true")
    d.add_argument(
        "--ddr-per-chiplet",
        action="store_true",
        help="a DDR channel per chiplet with remote loads ([D10]) instead of one package channel",
    )
    d.add_argument(
        "--preempt", action="store_true", help="compute preemption ([D11], A6) in the ring buffers"
    )
    d.add_argument(
        "--slice-table",
        action="store_true",
        help="a micro-slice count per expert in the DDR controller ([D13], sub-expert streaming)",
    )
    d.add_argument("--build-opt", default="-O0", choices=opts)
    d.add_argument(
        "--waves", action="store_true", help="record every signal of each --mesh run (VCD/FST)"
    )
    d.add_argument("--out", help="also write the report (Markdown) to this file")
    d.set_defaults(func=cmd_datapath, out_kind="file")
