"""``fsedp rtl ...``: Verilog, cosimulation of RTL against the golden models, latency and
area reports, synthesis to a standard-cell library.  Parsing and dispatch only: the options
are checked here (a bad one is one line, exit 2, before any work) and the runs and their
text are :mod:`fsedp.experiments.rtl_runs`'s (the synthesis flow's,
:mod:`fsedp.experiments.synth`'s)."""

import contextlib
import dataclasses
import tempfile

from fsedp.cli.common import (
    CONFIG,
    JSON,
    Parser,
    emit,
    field_doc,
    field_options,
    field_value,
    int_at_least,
    invoked,
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
from fsedp.log import logger
from fsedp.params import ADMISSION_RULES, DatapathParams, SchedulerParams
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
    from fsedp.hw.generate import BLOCKS, CHIP_BLOCKS, DATAPATH_BLOCKS

    p = _params(args)
    if args.lint:
        require_simulator("verilator")
    blocks = list(BLOCKS) if args.block == "all" else [args.block] if args.block in BLOCKS else []
    # the datapath blocks and the chip: generated on the run config's mesh
    dp_blocks = [b for b in (*DATAPATH_BLOCKS, *CHIP_BLOCKS) if args.block in ("all", b)]
    if dp_blocks and getattr(args, "chiplets", None) is not None:
        if args.block != "all":
            raise usage(
                "--chiplets",
                f"does not apply to {args.block}; its mesh is "
                "hardware.rows x hardware.cols of the run config",
            )
        dp_blocks = []  # --chiplets reshapes the scheduler only
    dp = _datapath_of(args, dp_blocks, p)
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
    lib = _report_library(args)
    chip_sp, dp = _report_chip(args, base) if lib is not None or args.fpga else (None, None)
    if not args.no_latency:
        require_simulator(args.sim)
    if args.fpga:
        from fsedp.experiments import fpga

        fpga.check_tools()
    with contextlib.ExitStack() as stack:
        library = None
        if lib is not None:
            from fsedp.experiments import synth
            from fsedp.experiments.rtl_report import Library

            work, fo4 = stack.enter_context(
                synth.workspace(lib, (lambda m: None) if args.json else logger("synth").info)
            )
            library = Library(lib, work, fo4, args.clock_mhz, args.activity, not args.json)
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
                library=library,
            )
        except InputError as e:
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
        doc = {"base_params": dataclasses.asdict(base), "rows": rows}
        if library is not None:
            from fsedp.experiments.rtl_report import chip_figures

            doc["library"] = {
                "name": lib.name,
                "liberty": str(lib.path),
                "clock_mhz": args.clock_mhz,
                "fo4_ps": fo4.get("fo4_ps"),
                "activity": args.activity,
                "datapath": f"{dp.rows}x{dp.cols} chiplets, E={dp.experts}",
            }
            doc["datapath"] = chip_figures(library, chip_sp, dp)
    if args.fpga:
        doc["fpga"] = _report_fpga(args, chip_sp, dp)
    command = invoked("rtl report")
    text = rtl_runs.report_page(command, args.sim, base, rows, doc)
    if args.out:
        write_output(args.out, text)
    emit(args, doc, text)
    figures = [
        f
        for r in rows
        for f in [*(r.get("library") or {}).values(), *(r.get("library_sorters") or {}).values()]
    ] + list(doc.get("datapath", {}).values())
    ok = all(
        not f.get("error") and f.get("activity", {}).get("passed", True) for f in figures
    ) and all(not f.get("error") for f in doc.get("fpga", []))
    return 0 if ok else 1


def _report_library(args):
    """``rtl report --liberty``: the library read and the tools checked, or ``None``."""
    if args.liberty is None:
        if args.activity:
            raise usage("--activity", "needs --liberty (the power of a mapped netlist)")
        return None
    return _read_library(args, "rtl report")


def _read_library(args, verb: str):
    """``--liberty`` read and checked, then the tools its flow (and ``--activity``) needs:
    each a line and exit 2 (the options' own rules first, not what is installed)."""
    from fsedp.experiments import synth

    if not args.liberty.strip() or "\0" in args.liberty:
        raise usage("--liberty", f"must name a Liberty file, not {args.liberty[:40]!r}")
    try:
        lib = synth.read_liberty(args.liberty)
    except InputError as e:
        raise usage("--liberty", f"{args.liberty[:200]}: {e.reason}") from None
    missing = synth.missing_tools()
    if args.activity:
        from fsedp.tb.runner import simulator_missing

        why = simulator_missing("verilator")
        if why:
            missing.append(f"--activity: {why}")
    if missing:
        raise usage(verb, f"needs {' and '.join(missing)} on PATH")
    return lib


def library_options(parser, required: bool, CLOCK_MHZ, CLOCK_RANGE_MHZ):
    """``--liberty``, ``--clock-mhz`` and ``--activity`` of the flows to a library."""
    parser.add_argument(
        "--liberty",
        required=required,
        metavar="FILE",
        help="the standard-cell library (Liberty)"
        + ("" if required else ": also map and time every block, sorter variant and the chip"),
    )
    parser.add_argument(
        "--clock-mhz",
        type=number("--clock-mhz", *CLOCK_RANGE_MHZ),
        default=CLOCK_MHZ,
        help="clock the mapped paths are timed at, MHz",
    )
    parser.add_argument(
        "--activity",
        action="store_true",
        help="run each block's bench on its mapped netlist (Verilator) and report the power "
        "also from the switching activity recorded there",
    )


def _report_chip(args, base):
    """The generics of the report's small chip (its blocks, the chip top and the FPGA rows):
    the run config's mesh and datapath, the scheduler's generics with its chiplets and
    ``--chip-experts`` experts."""
    dp = load_config(args).datapath_params()
    try:
        dp = dataclasses.replace(dp, experts=args.chip_experts)
        sp = dataclasses.replace(base, experts=args.chip_experts, chiplets=dp.chiplets)
    except (InputError, ValueError) as e:
        raise usage("--chip-experts", f"{args.chip_experts}: {getattr(e, 'reason', e)}") from None
    return sp, dp


def _report_fpga(args, sp, dp) -> list:
    """``rtl report --fpga``: the scheduler and the chip top on the ECP5 (``fsedp rtl
    fpga``'s flow, its default device and target)."""
    from fsedp.experiments import fpga

    with tempfile.TemporaryDirectory(prefix="fsedp-fpga-") as tmp:
        return fpga.run_fpga(
            ("scheduler", "chip"),
            workdir=tmp,
            params=sp,
            dp_params=dp,
            progress=None if args.json else logger("fpga").info,
        )


def _mesh(text: str, layers: int, option: str = "--mesh") -> tuple[int, int, int]:
    """``ROWSxCOLS[:LAYERS]`` of ``option``."""
    try:
        shape, _, n = text.lower().partition(":")
        r, c = (int(x) for x in shape.split("x"))
        n = int(n) if n else layers
    except ValueError:
        raise usage(
            option, f"expected ROWSxCOLS[:LAYERS] such as 2x2 or 4x4:100, not {text[:40]!r}"
        ) from None
    if not (1 <= r <= 16 and 1 <= c <= 16):
        raise usage(option, f"{text[:40]}: rows and cols must be in 1..16")
    if not 1 <= n <= 10**6:
        raise usage(option, f"the number of layers must be in 1..1000000, not {n}")
    return r, c, n


def cmd_datapath(args):
    from fsedp.experiments.datapath_report import (
        admission_cells_table,
        cells_table,
        format_markdown,
        ring_table,
        run_params,
    )

    meshes = [(_mesh(m, args.layers), m) for m in args.mesh or []]
    admission_meshes = [_mesh(m, 1, "--admission-cells")[:2] for m in args.admission_cells or []]
    for (r, c), m in zip(admission_meshes, args.admission_cells or []):
        if r * c < 2:
            raise usage("--admission-cells", f"{m}: a mesh of at least 2 chiplets")
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
        admission=args.admission,
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
                if v is not None and k not in ("preempt", "slice_table", "admission")
            )
            + (" --preempt" if args.preempt else "")
            + (" --slice-table" if args.slice_table else "")
            + (" --rule5" if args.rule5 else "")
            + (" --ddr-per-chiplet" if args.ddr_per_chiplet else "")
            + (f" --admission {args.admission}" if args.admission != "forward-count" else ""),
        )
        runs.append(res)
    if admission_meshes:
        doc["admission_cells"] = admission_cells_table(admission_meshes)
    doc["runs"] = runs
    text = format_markdown(
        doc.get("ring"), doc.get("cells"), cells_params, runs, doc.get("admission_cells")
    )
    if args.out:
        write_output(args.out, rtl_runs.datapath_page(invoked("rtl datapath"), text))
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


def _datapath_of(args, tops, p):
    """The datapath generics of the run config for the datapath blocks and the chip among
    ``tops`` (with the scheduler's experts), or ``None`` when none is asked for; the chip
    needs the scheduler's chiplets to be the config's mesh."""
    from fsedp.hw.generate import CHIP_BLOCKS, DATAPATH_BLOCKS

    if not any(t in DATAPATH_BLOCKS or t in CHIP_BLOCKS for t in tops):
        return None
    dp = dataclasses.replace(load_config(args).datapath_params(), experts=p.experts)
    if any(t in CHIP_BLOCKS for t in tops) and dp.chiplets != p.chiplets:
        raise usage(
            "--chiplets",
            f"{p.chiplets}: the chip top's scheduler drives the run config's "
            f"{dp.rows}x{dp.cols} mesh ({dp.chiplets} chiplets)",
        )
    return dp


def cmd_synth(args):
    """``fsedp rtl synth``: the blocks synthesised to a standard-cell library and timed
    (:mod:`fsedp.experiments.synth`)."""
    from fsedp.experiments import synth
    from fsedp.hw.generate import CHIP_BLOCKS, DATAPATH_BLOCKS

    tops = list(dict.fromkeys(args.top or synth.DEFAULT_TOPS))
    for t in tops:
        if t not in synth.TOPS:
            raise usage("--top", f"unknown top {t[:40]!r}; choose from {', '.join(synth.TOPS)}")
    p = _params(args)
    dp_tops = [t for t in tops if t in DATAPATH_BLOCKS or t in CHIP_BLOCKS]
    if dp_tops and args.chiplets is not None:
        if args.top:
            raise usage(
                "--chiplets",
                f"does not apply to {dp_tops[0]}; its mesh is "
                "hardware.rows x hardware.cols of the run config",
            )
        tops, dp_tops = [t for t in tops if t not in dp_tops], []  # reshapes the scheduler only
    dp = _datapath_of(args, tops, p)
    lib = _read_library(args, "rtl synth")
    command = invoked("rtl synth")
    out = args.out or build_dir("synth")
    run = synth.run(
        tops,
        p,
        dp,
        lib,
        args.clock_mhz,
        out,
        args.force,
        command,
        quiet=args.json,
        activity=args.activity,
    )
    return _done(args, *run)


def cmd_fpga(args):
    """``fsedp rtl fpga``: the blocks placed and routed on a Lattice ECP5
    (:mod:`fsedp.experiments.fpga`)."""
    from fsedp import jsondoc
    from fsedp.experiments import fpga
    from fsedp.files import output_dir
    from fsedp.log import logger

    tops = fpga.check_request(args.top or fpga.DEFAULT_TOPS, args.device, args.freq_mhz)
    p = _params(args)
    dp = _datapath_of(args, tops, p)
    fpga.check_tools()  # the options' own rules first: not what is installed
    run = dict(
        device=args.device,
        freq_mhz=args.freq_mhz,
        params=p,
        dp_params=dp,
        progress=None if args.json else logger("fpga").info,
    )
    doc = {
        "device": fpga.DEVICES[args.device],
        "package": fpga.PACKAGE,
        "speed_grade": fpga.SPEED_GRADE,
        "freq_mhz": args.freq_mhz,
    }
    with output_dir(args.out or build_dir("fpga"), args.force) as staged:
        rows = fpga.run_fpga(tops, workdir=staged, **run)
        doc["tops"] = rows
        (staged / "fpga.json").write_text(jsondoc.dumps(doc, indent=1) + "\n")
        (staged / "fpga.md").write_text(rtl_runs.fpga_page(invoked("rtl fpga"), rows))
    return _done(args, doc, fpga.fpga_table(rows), all(not r.get("error") for r in rows))


def top_option(parser, verb: str, tops, default):
    """``--top NAME ...`` of a flow over blocks (``rtl synth``, ``rtl fpga``)."""
    parser.add_argument(
        "--top",
        action="extend",
        nargs="+",
        metavar="NAME",
        help=f"blocks to {verb}, of {', '.join(tops)} (repeatable; default: {', '.join(default)})",
    )


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    from fsedp.experiments.fpga import DEFAULT_DEVICE as FPGA_DEVICE
    from fsedp.experiments.fpga import DEFAULT_TOPS as FPGA_DEFAULT_TOPS
    from fsedp.experiments.fpga import DEVICES as FPGA_DEVICES
    from fsedp.experiments.fpga import FREQ_MHZ as FPGA_FREQ_MHZ
    from fsedp.experiments.fpga import FREQ_RANGE_MHZ as FPGA_FREQ_RANGE_MHZ
    from fsedp.experiments.fpga import TOPS as FPGA_TOPS
    from fsedp.experiments.synth import CLOCK_MHZ, CLOCK_RANGE_MHZ, DEFAULT_TOPS
    from fsedp.experiments.synth import TOPS as SYNTH_TOPS
    from fsedp.hw.generate import BLOCKS, CHIP_BLOCKS, DATAPATH_BLOCKS

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
    v.add_argument(
        "--block", default="all", choices=["all", *BLOCKS, *DATAPATH_BLOCKS, *CHIP_BLOCKS]
    )
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
    library_options(r, False, CLOCK_MHZ, CLOCK_RANGE_MHZ)
    r.add_argument(
        "--fpga",
        action="store_true",
        help="also place and route the scheduler and the chip top on the ECP5 (the 'fpga' extra)",
    )
    r.add_argument(
        "--chip-experts",
        type=positive("--chip-experts", 4096),
        default=16,
        help="experts of the small chip (the config's mesh) whose every block and chip top "
        "are mapped with gate-level runs (with --liberty) and placed on the FPGA (--fpga)",
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

    sy = rsub.add_parser(
        "synth",
        parents=[CONFIG, JSON],
        help="synthesis to a standard-cell library (Yosys, ABC) and static timing (OpenSTA): "
        "area, critical path, slack, FO4, vectorless power and, with --activity, power from "
        "a gate-level run of each block's bench",
    )
    sizes(sy)
    library_options(sy, True, CLOCK_MHZ, CLOCK_RANGE_MHZ)
    top_option(sy, "synthesise", SYNTH_TOPS, DEFAULT_TOPS)
    sy.add_argument("--out", help="output folder (default: build/synth)")
    sy.set_defaults(func=cmd_synth, out_kind="folder")

    fp = rsub.add_parser(
        "fpga",
        parents=[CONFIG, JSON],
        help="Lattice ECP5 (Yosys synth_ecp5, nextpnr-ecp5): LUT4, flip-flop, carry, block "
        "and distributed RAM use, Fmax (the 'fpga' extra)",
    )
    sizes(fp)
    fp.add_argument(
        "--device",
        default=FPGA_DEVICE,
        choices=list(FPGA_DEVICES),
        help="ECP5 part LFE5U-25F/45F/85F, package CABGA381, speed grade 6",
    )
    top_option(fp, "place and route", FPGA_TOPS, FPGA_DEFAULT_TOPS)
    fp.add_argument(
        "--freq-mhz",
        type=number("--freq-mhz", *FPGA_FREQ_RANGE_MHZ),
        default=FPGA_FREQ_MHZ,
        help="target frequency of nextpnr's timing-driven placement and routing, MHz",
    )
    fp.add_argument(
        "--out",
        help="report folder: fpga.md, fpga.json, each top's work folder (default: build/fpga)",
    )
    fp.set_defaults(func=cmd_fpga, out_kind="folder")

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
    d.add_argument(
        "--admission",
        choices=ADMISSION_RULES,
        default="forward-count",
        help=field_doc(DatapathParams, "admission"),
    )
    d.add_argument(
        "--admission-cells",
        action="append",
        metavar="ROWSxCOLS",
        help="measure one chiplet's cells under each admission rule on this mesh (repeatable)",
    )
    d.add_argument("--build-opt", default="-O0", choices=opts)
    d.add_argument(
        "--waves", action="store_true", help="record every signal of each --mesh run (VCD/FST)"
    )
    d.add_argument("--out", help="also write the report (Markdown) to this file")
    d.set_defaults(func=cmd_datapath, out_kind="file")
