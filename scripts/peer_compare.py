#!/usr/bin/env python
"""Our simulator side by side with the peer FSE-DP simulator.

The peer is the public Python simulator Man0xbfc00380/MoeOpt (EP, Hydra, FSE-DP and FSE-DP
with paired load; no RTL).  This script never copies its code: it runs the peer's own runner
(``evaluation/runner_one_layer.py`` of a checkout given with ``--peer``, which must lie
outside this repository) as a subprocess, feeding it through the runner's own
``--trace_json`` option the same routing that our simulator gets, and a config written in the
peer's JSON format with the settings of the peer's shipped configs
(``evaluation/configs/{EP,Hydra,FSE-DP,FSE-DP-paired}_<tokens>_2_mul_2.json``).

Per point (mesh, model, tokens per iteration) it:

1. builds one routing: our seeded synthetic trace (``fsedp.workload.scenario_trace``, the
   run config's seed and skew) or the trace file given with ``--trace`` (its first
   ``tokens`` tokens);
2. runs our strategies (``fsedp.sim.run.run_experiment``: EP, EP-paper, Hydra, A2, A3, A6)
   on the first ``--layers`` MoE layers of it;
3. writes each of those layers as the peer's trace JSON (``{token index: [expert ids]}``),
   tokens ordered so that the peer's even token split puts on its chip ``c`` exactly the
   tokens our sharding puts on our chiplet ``c``, and runs the peer's four strategies on
   every layer;
4. writes a markdown table (both simulators' latencies and utilizations per strategy, the
   peer's two metrics -- latency ratio and utilization ratio -- and ours, next to the paper's
   claim) between the markers ``<!-- peer_compare: begin -->`` and
   ``<!-- peer_compare: end -->`` of ``--out`` (the rest of the file is kept).

Mappings (stated in the table caption and in ``docs/peer-simulator.md``): model shapes are the
same numbers on both sides (``--model`` is our name, the peer's is looked up in
:data:`PEER_MODELS`); the hardware constants the peer uses (0.8 GHz, 2048 MACs per chip,
288 GB/s D2D, 25.6 GB/s per DDR channel, fixed in its ``model_shape_map.py``) are Table I's,
as are ours; one peer frame is 40 cycles at 0.8 GHz = 50 ns.

    .venv/bin/python scripts/peer_compare.py --peer /tmp/moeopt \
        --out docs/peer-simulator.md docs/results.md
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from fsedp.config import run_from_dict
from fsedp.sim.run import run_experiment
from fsedp.trace.core import shard
from fsedp.trace.io import load_any
from fsedp.workload import scenario_trace

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- peer_compare: begin -->"
END = "<!-- peer_compare: end -->"

#: our model config name -> the peer's MODEL_SHAPE_MAP key (same d_model, d_ffn, experts)
PEER_MODELS = {
    "deepseek-moe-16b": "DeepSeek-MoE",
    "qwen3-30b-a3b": "Qwen3-MoE",
    "phi-3.5-moe": "Phi3.5-MoE",
    "yuan2.0-m32": "Yuan2.0",
}
#: mesh -> our hardware config
HARDWARE = {"2x2": "chip2x2", "3x3": "mesh3x3", "4x4": "mesh4x4"}
PEER_STRATEGIES = ("EP", "Hydra", "FSE-DP", "FSE-DP-paired")
OUR_STRATEGIES = ("EP", "EP-paper", "Hydra", "A2", "A3", "A6")
#: the peer's frame: its durations are cycles / 40 ("* 40 to accelerate the simulation")
PEER_CYCLES_PER_FRAME = 40
PEER_CLOCK_GHZ = 0.8
PAPER = (
    "FSE-DP 1.22-2.00x faster than the state-of-the-art baselines (EP, Hydra): abstract; "
    "Figure 9, single MoE-layer latency, 2x2 test chip, 16-1024 tokens per iteration"
)


def peer_config(strategy: str, rows: int, cols: int, tokens: int, out_dir: Path) -> dict:
    """The peer's JSON config for one strategy, with the settings of its shipped configs
    (``evaluation/configs/*_<tokens>_2_mul_2.json``; ``action_durations`` and
    ``ddr_buffer_size`` are left out: the peer's runner derives them from the model)."""
    chips = rows * cols
    ep = strategy in ("EP", "Hydra")
    return {
        "seed": 2025,
        "base_strategy": "EP" if ep else "FSEDP",
        "frames": 50_000_000,
        "output_dir": str(out_dir),
        "hardware": {
            "row_number_of_chip": rows,
            "column_number_of_chip": cols,
            # EP receives every token it computes: 512 (2048 at 1024 tokens) in the shipped
            # configs; FSE-DP never moves a token: its share (N / chips in the shipped ones)
            "token_buffer_size": max(512, 2 * tokens) if ep else max(4, -(-tokens // chips)),
            "expert_buffer_size": 2 if ep else 12,
            # the DDR arrays are built with this size before the runner shrinks
            # HardwareConfig.ddr_buffer_size to experts x micro-slices / 4
            "ddr_buffer_size": 512,
        },
        "scheduler": {
            "micro_slice_num_per_expert": 1 if ep else 16,
            "token_number": tokens,
            "min_activated_token": 0,
            # Hydra's shipped configs skip experts with a single token below 1024 tokens
            "token_weight_threshould": 1 if strategy == "Hydra" and tokens < 1024 else 0,
            "expert_distribution_mode": "SEQUENTIAL" if strategy == "FSE-DP" else "EVEN",
            "token_distribution_mode": "EVEN",
            "ddr_load_mode": "SEQUENTIAL",
            "destination_select_mode": "MAX_BONDED_TOKENS" if strategy == "Hydra" else "NEAREST",
            "path_mode": "VOTEX",
            "redispatch_mode": "NO_REDISPATCH",
            "paired": strategy in ("Hydra", "FSE-DP-paired"),
        },
    }


def peer_token_order(chiplet: np.ndarray, chips: int) -> list[int]:
    """Our token indices in the order to give the peer: its EVEN split puts tokens
    ``[c * n / chips, (c + 1) * n / chips)`` on its chip ``c`` (row-major), so our chiplet
    ``c``'s tokens come ``c``-th."""
    counts = np.bincount(chiplet, minlength=chips)
    if len(set(counts.tolist())) != 1:
        raise SystemExit(
            f"peer_compare: the peer splits tokens evenly; our sharding gives {counts.tolist()}"
        )
    return [int(t) for c in range(chips) for t in np.flatnonzero(chiplet == c)]


def peer_csv(path: Path):
    """(finish frame, steady-phase utilization) from the ``trace.csv`` a peer run wrote: the
    same two numbers its runner prints (``MetricsLogger.finish_frame`` and
    ``average_chip_utilization_for_phase(STEADY)``: phases 3 and 2)."""
    finish, ratios = None, []
    with path.open() as f:
        for row in csv.DictReader(f):
            phase = int(row["phase"])
            if phase == 3 and finish is None:
                finish = int(row["frame"])
            elif phase == 2:
                total = int(row["chips_total"])
                ratios.append(int(row["chips_computing"]) / total if total else 0.0)
    if finish is None:
        raise RuntimeError(f"{path}: the peer run did not finish")
    return finish, sum(ratios) / len(ratios) if ratios else 0.0


def run_peer(
    peer: Path,
    cfg_path: Path,
    trace_path: Path,
    model: str,
    tokens: int,
    timeout: int,
    resume: bool = False,
):
    """One layer on the peer: (finish frame, steady-phase utilization, wall seconds).  With
    ``resume``, a run whose ``trace.csv`` is already in its output folder is read back."""
    out = Path(json.loads(cfg_path.read_text())["output_dir"]) / "trace.csv"
    if resume and out.is_file():
        return (*peer_csv(out), 0.0)
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        str(peer / "evaluation" / "runner_one_layer.py"),
        "--config",
        str(cfg_path),
        "--trace_json",
        str(trace_path),
        "--model",
        model,
        "--input_length",
        str(tokens),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    fin = re.search(r"FINISH occurred at frame: (\d+)", p.stdout)
    util = re.search(r"utilization in STEADY phase: ([0-9.]+)", p.stdout)
    if p.returncode or not fin or not util:
        tail = (p.stdout + p.stderr)[-2000:]
        raise RuntimeError(f"peer run failed ({' '.join(cmd)}):\n{tail}")
    return int(fin.group(1)), float(util.group(1)), wall


def ours_config(mesh: str, model: str, tokens: int, seed: int, skew: float):
    return run_from_dict(
        {
            "hardware": HARDWARE[mesh],
            "model": model,
            "scheduler": "default",
            "scenario": {
                "tokens_per_iteration": tokens,
                "seed": seed,
                "trace": "synthetic",
                "skew": skew,
                "prefill_fraction": 0.5,
                "sharding": "token",
            },
        },
        source="scripts/peer_compare.py",
    )


def point(args, mesh: str, model: str, tokens: int, work: Path, pool) -> dict:
    rows, cols = (int(x) for x in mesh.split("x"))
    chips = rows * cols
    cfg = ours_config(mesh, model, tokens, args.seed, args.skew)
    m = cfg.model
    layers = args.layers if tokens < args.big_tokens else min(args.layers, args.layers_big)
    if args.trace:
        trace = load_any(args.trace, num_experts=m.experts)
    else:
        # our generator exactly as `fsedp run` draws it (requests of 16 tokens, a request
        # table's worth at most), all of the model's layers (a given trace must have them)
        trace = scenario_trace(cfg, 1, m.layers)
    # ours
    t0 = time.perf_counter()
    run = run_experiment(cfg, OUR_STRATEGIES, 1, layers, progress=False, trace=trace, workers=1)
    ours_wall = time.perf_counter() - t0
    setup = run["setup"]
    ours = {}
    for s, rs in run["results"].items():
        cyc = sum(r.cycles for r in rs)
        busy = sum(sum(r.busy) for r in rs)
        ours[s] = {
            "us": cyc / len(rs) * setup.ns_per_cycle / 1000,
            "util": busy / (setup.chiplets * cyc) if cyc else 0.0,
        }
    # the peer, on the same tokens and layers
    chiplet = shard(trace, chips, mode=cfg.scenario.sharding)[:tokens]
    order = peer_token_order(chiplet, chips)
    d = work / f"{mesh}-{model}-{tokens}"
    d.mkdir(parents=True, exist_ok=True)
    jobs = []
    for layer in range(layers):
        tj = d / f"layer{layer}.json"
        tj.write_text(
            json.dumps(
                {str(j): [int(e) for e in trace.experts[t, layer]] for j, t in enumerate(order)}
            )
        )
        for s in PEER_STRATEGIES:
            cj = d / f"{s}-layer{layer}.json"
            cj.write_text(json.dumps(peer_config(s, rows, cols, tokens, d / f"out-{s}-{layer}")))
            jobs.append((s, layer, cj, tj))
    futures = {
        (s, layer): pool.submit(
            run_peer,
            args.peer,
            cj,
            tj,
            PEER_MODELS[model],
            tokens,
            args.peer_timeout,
            args.resume,
        )
        for s, layer, cj, tj in jobs
    }
    peer = {}
    for s in PEER_STRATEGIES:
        res = [futures[s, layer].result() for layer in range(layers)]
        frames = sum(r[0] for r in res)
        peer[s] = {
            "frames": frames / layers,
            "us": frames / layers * PEER_CYCLES_PER_FRAME / PEER_CLOCK_GHZ / 1000,
            "util": sum(r[1] for r in res) / layers,
            "wall_s": sum(r[2] for r in res),
        }
    return {
        "mesh": mesh,
        "model": model,
        "tokens": tokens,
        "layers": layers,
        "active_experts": float(
            np.mean([len(np.unique(trace.experts[:tokens, l])) for l in range(layers)])
        ),
        "ours": ours,
        "ours_wall_s": ours_wall,
        "peer": peer,
        "micro_slices": setup.dp.micro_slices,
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _in_claim(x: float) -> str:
    return "yes" if 1.22 <= x <= 2.00 else ("above" if x > 2.00 else "no")


def table(points: list[dict], command: str) -> str:
    lines = [
        f"Generated by `{command}` ({sum(p['layers'] for p in points)} layer-points; one "
        f"routing per point, the same for both simulators). **Paper:** {PAPER}.",
        "",
        "**Latency (us per MoE layer) and utilization.** Peer: finish frame x 50 ns (one frame "
        "is 40 cycles at 0.8 GHz), utilization = its STEADY-phase mean of computing chips / "
        "chips. Ours: `fsedp.sim.run.run_experiment`, utilization = busy chiplet-cycles / "
        "(chiplets x cycles). FSE-DP without paired load: peer `FSE-DP`, our A2; with paired "
        "load: peer `FSE-DP-paired`, our A3.",
        "",
        "| mesh | model | tokens | layers | simulator | EP | Hydra | FSE-DP | FSE-DP paired "
        "| our EP-paper | our A6 |",
        "|---|---|---:|---:|---|---|---|---|---|---|---|",
    ]

    def cell(r):
        return f"{r['us']:.1f} us / {100 * r['util']:.1f} %"

    for p in points:
        head = f"| {p['mesh']} | {p['model']} | {p['tokens']} | {p['layers']} "
        pe, o = p["peer"], p["ours"]
        lines.append(
            head
            + f"| peer | {cell(pe['EP'])} | {cell(pe['Hydra'])} | {cell(pe['FSE-DP'])} "
            + f"| {cell(pe['FSE-DP-paired'])} | - | - |"
        )
        lines.append(
            head
            + f"| ours | {cell(o['EP'])} | {cell(o['Hydra'])} | {cell(o['A2'])} "
            + f"| {cell(o['A3'])} | {cell(o['EP-paper'])} | {cell(o['A6'])} |"
        )
    lines += [
        "",
        "**Metrics: FSE-DP with paired load over each baseline.** Latency ratio = baseline "
        "latency / FSE-DP latency (a speedup); utilization ratio = FSE-DP utilization / "
        "baseline utilization. 'in 1.22-2.00x' says whether the latency ratio over EP / over "
        "Hydra falls in the paper's range.",
        "",
        "| mesh | model | tokens | peer latency ratio vs EP / Hydra | peer utilization ratio "
        "vs EP / Hydra | peer in 1.22-2.00x | our latency ratio A3 vs EP / Hydra / EP-paper "
        "| our utilization ratio A3 vs EP / Hydra | ours in 1.22-2.00x "
        "| our latency ratio A6 vs EP / Hydra / EP-paper |",
        "|---|---|---:|---|---|---|---|---|---|---|",
    ]
    for p in points:
        pe, o = p["peer"], p["ours"]
        f, a3, a6 = pe["FSE-DP-paired"], o["A3"], o["A6"]["us"]
        pl = [pe["EP"]["us"] / f["us"], pe["Hydra"]["us"] / f["us"]]
        ol = [o["EP"]["us"] / a3["us"], o["Hydra"]["us"] / a3["us"]]
        lines.append(
            f"| {p['mesh']} | {p['model']} | {p['tokens']} "
            f"| {pl[0]:.2f} / {pl[1]:.2f} "
            f"| {_ratio(f['util'], pe['EP']['util'])} / {_ratio(f['util'], pe['Hydra']['util'])} "
            f"| {_in_claim(pl[0])} / {_in_claim(pl[1])} "
            f"| {ol[0]:.2f} / {ol[1]:.2f} / {o['EP-paper']['us'] / a3['us']:.2f} "
            f"| {_ratio(a3['util'], o['EP']['util'])} / {_ratio(a3['util'], o['Hydra']['util'])} "
            f"| {_in_claim(ol[0])} / {_in_claim(ol[1])} "
            f"| {o['EP']['us'] / a6:.2f} / {o['Hydra']['us'] / a6:.2f} "
            f"/ {o['EP-paper']['us'] / a6:.2f} |"
        )
    walls = []
    for p in points:
        peer_s = sum(v["wall_s"] for v in p["peer"].values())
        peer_txt = f"peer {peer_s:.0f} s" if peer_s else "peer read back (--resume)"
        walls.append(f"{p['mesh']} {p['tokens']}: {peer_txt}, ours {p['ours_wall_s']:.1f} s")
    lines += ["", "Wall time (all strategies and layers of a point): " + "; ".join(walls) + "."]
    return "\n".join(lines)


def write_block(out: Path, block: str) -> None:
    text = out.read_text() if out.exists() else ""
    new = f"{BEGIN}\n\n{block}\n\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + new + tail
    else:
        text = (text + "\n\n" if text else "") + new + "\n"
    out.write_text(text)


def _outside_repo(path: Path, what: str) -> Path:
    p = path.resolve()
    if p == REPO or REPO in p.parents:
        raise SystemExit(f"peer_compare: {what} {p} must lie outside this repository")
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--peer", type=Path, required=True, help="the peer's checkout (outside the repo)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        nargs="+",
        required=True,
        help="markdown files to write the table into (each between its markers)",
    )
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--models", default="deepseek-moe-16b", help="our model names, comma-separated")
    ap.add_argument("--tokens", default="16,64,256,1024", help="tokens per iteration on --mesh")
    ap.add_argument("--mesh", default="2x2", choices=sorted(HARDWARE))
    ap.add_argument(
        "--extra",
        default="4x4:qwen3-30b-a3b:256",
        help="extra points MESH:MODEL:TOKENS, comma-separated ('' for none)",
    )
    ap.add_argument("--layers", type=int, default=2, help="MoE layers per point")
    ap.add_argument(
        "--big-tokens", type=int, default=256, help="points this large get --layers-big"
    )
    ap.add_argument("--layers-big", type=int, default=1, help="MoE layers per large point")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skew", type=float, default=1.1)
    ap.add_argument("--trace", type=Path, help="a routing trace file instead of synthetic ones")
    ap.add_argument("--work", type=Path, help="folder for the peer's inputs (default: a temp dir)")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="read back peer runs whose trace.csv is already in --work (same inputs)",
    )
    ap.add_argument("--jobs", type=int, default=2, help="peer runs at once")
    ap.add_argument("--peer-timeout", type=int, default=1800, help="seconds per peer run")
    args = ap.parse_args(argv)
    args.peer = _outside_repo(args.peer, "--peer")
    if not (args.peer / "evaluation" / "runner_one_layer.py").is_file():
        raise SystemExit(f"peer_compare: {args.peer} has no evaluation/runner_one_layer.py")
    work = _outside_repo(args.work or Path(tempfile.mkdtemp(prefix="peer_compare_")), "--work")
    todo = [
        (args.mesh, m, int(t))
        for m in filter(None, args.models.split(","))
        for t in filter(None, args.tokens.split(","))
    ]
    for spec in filter(None, args.extra.split(",")):
        mesh, m, t = spec.split(":")
        todo.append((mesh, m, int(t)))
    for _, m, _ in todo:
        if m not in PEER_MODELS:
            raise SystemExit(f"peer_compare: no peer model for {m}; have {', '.join(PEER_MODELS)}")
    points = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for mesh, m, t in todo:
            print(f"peer_compare: {mesh} {m} {t} tokens ...", file=sys.stderr, flush=True)
            points.append(point(args, mesh, m, t, work, pool))
    command = "python scripts/peer_compare.py --peer PEER --out " + " ".join(map(str, args.out))
    defaults = {"--models": "deepseek-moe-16b", "--tokens": "16,64,256,1024"}
    for flag, default in defaults.items():
        v = getattr(args, flag[2:])
        if v != default:
            command += f" {flag} {v}"
    if args.extra != "4x4:qwen3-30b-a3b:256":
        command += f" --extra '{args.extra}'"
    if args.layers != 2:
        command += f" --layers {args.layers}"
    if args.trace:
        command += f" --trace {args.trace}"
    block = table(points, command)
    for out in args.out:
        write_block(out, block)
    if args.json:
        args.json.write_text(json.dumps(points, indent=1))
    for p in points:
        f, o = p["peer"]["FSE-DP-paired"]["us"], p["ours"]
        print(
            f"{p['mesh']} {p['model']} {p['tokens']}: "
            f"peer EP/FSE-DPp {p['peer']['EP']['us'] / f:.2f}, "
            f"ours EP/A3 {o['EP']['us'] / o['A3']['us']:.2f}",
            file=sys.stderr,
        )
    return 0 if all(math.isfinite(p["peer"]["EP"]["us"]) for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
