"""``fsedp run --scheduler rtl``: the scheduling decisions of every simulated FSE-DP A3 and
A6 layer replayed through the scheduler RTL under Verilator (A6 with its generics: the
balanced order and entry dispatch).

The scheduler's decisions are a function of its gate records and of the sequence of
completion masks (``docs/blocks/scheduler.md``).  For each layer the simulator records both
and the decisions the golden model made; the cocotb testbench (``tb/tb_scheduler.py``) feeds
the records and replays the completions (:class:`fsedp.tb.scoreboard.ScriptedDatapath`) into the
generated Verilog, and compares its dispatch beats with the recorded ones, decision by
decision; the report names the first difference.
"""

from pathlib import Path

from fsedp import jsondoc
from fsedp.config import RunConfig

__all__ = ["RTLSchedulerCheck", "CHECKED"]

#: The strategies whose scheduler the RTL implements.
CHECKED = ("A3", "A6")


class RTLSchedulerCheck:
    def __init__(self, cfg: RunConfig, build: Path, strategies=CHECKED):
        self.cfg, self.build = cfg, Path(build)
        self.rounds: dict[str, list] = {s: [] for s in strategies}

    def record(self, strategy, layer, result):
        if strategy not in self.rounds:
            return
        self.rounds[strategy].append(
            {
                "records": [list(r) for r in layer.records],
                "req_inits": [],
                "done_script": result.script,
                "expected": result.beats,
            }
        )

    def finish(self) -> dict:
        """Run the recorded layers through the RTL, one build per strategy; a summary of the
        agreement (``per_strategy`` has each strategy's)."""
        per = {s: self._check(s, rounds) for s, rounds in self.rounds.items() if rounds}
        if not per:
            return {
                "layers": 0,
                "beats": 0,
                "mismatches": 0,
                "first_mismatch": None,
                "note": f"no {' or '.join(self.rounds)} layer was simulated",
            }
        first = next(
            (f"{s}: {r['first_mismatch']}" for s, r in per.items() if r["mismatches"]), None
        )
        return {
            "layers": sum(r["layers"] for r in per.values()),
            "beats": sum(r["beats"] for r in per.values()),
            "mismatches": sum(r["mismatches"] for r in per.values()),
            "first_mismatch": first,
            "per_strategy": per,
        }

    def _check(self, strategy: str, rounds: list) -> dict:
        import dataclasses

        from fsedp.sim.fsedp import make_scheduler, variant_params
        from fsedp.sim.setup import make_setup
        from fsedp.tb.runner import run_tb

        setup = make_setup(self.cfg)
        sp = make_scheduler(setup.sp, variant_params(setup, strategy), strategy).p
        build = self.build / strategy
        build.mkdir(parents=True, exist_ok=True)
        path = build / "rounds.json"
        path.write_text(jsondoc.dumps(rounds))
        res = run_tb(
            "scheduler",
            sp,
            "verilator",
            build,
            seed=1,
            tag=f"-simcheck-{strategy}",
            knobs={"rounds_file": str(path), "stall": 0.0, "seed": 1},
            opt="-O0",
        )
        diffs = res.get("expected_mismatches", []) + res.get("first_mismatches", [])
        mismatches = len(diffs) + (res.get("failed", 1) and not diffs)
        return {
            "layers": len(rounds),
            "beats": sum(len(r["expected"]) for r in rounds),
            "rtl_beats": res.get("beats"),
            "mismatches": mismatches,
            "first_mismatch": diffs[0]
            if diffs
            else (None if not mismatches else f"testbench failed, see {res.get('log')}"),
            "params": dataclasses.asdict(sp),
            "log": res.get("log"),
        }
