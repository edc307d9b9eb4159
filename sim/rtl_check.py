"""``fsedp run --scheduler rtl``: the scheduling decisions of every simulated FSE-DP A3 layer
replayed through the scheduler RTL under Verilator.

The scheduler's decisions are a function of its gate records and of the sequence of
completion masks (``docs/blocks/scheduler.md``).  For each layer the simulator records both
and the decisions the golden model made; the cocotb testbench (``tb/tb_scheduler.py``) feeds
the records and replays the completions (:class:`fsedp.tb.scoreboard.ScriptedDatapath`) into the
generated Verilog, and compares its dispatch beats with the recorded ones, decision by
decision; the report names the first difference.
"""

import json
from pathlib import Path

from fsedp.config import RunConfig

__all__ = ["RTLSchedulerCheck"]


class RTLSchedulerCheck:
    def __init__(self, cfg: RunConfig, build: Path, strategy: str = "A3"):
        self.cfg, self.build, self.strategy = cfg, Path(build), strategy
        self.rounds = []

    def record(self, strategy, layer, result):
        if strategy != self.strategy:
            return
        self.rounds.append(
            {
                "records": [list(r) for r in layer.records],
                "req_inits": [],
                "done_script": result.script,
                "expected": result.beats,
            }
        )

    def finish(self) -> dict:
        """Run the recorded layers through the RTL; a summary of the agreement."""
        import dataclasses

        from fsedp.sim.setup import make_setup
        from fsedp.tb.runner import run_tb

        sp = make_setup(self.cfg).sp
        if not self.rounds:
            return {
                "layers": 0,
                "beats": 0,
                "mismatches": 0,
                "first_mismatch": None,
                "note": f"no {self.strategy} layer was simulated",
            }
        self.build.mkdir(parents=True, exist_ok=True)
        path = self.build / "rounds.json"
        path.write_text(json.dumps(self.rounds))
        res = run_tb(
            "scheduler",
            sp,
            "verilator",
            self.build,
            seed=1,
            tag="-simcheck",
            knobs={"rounds_file": str(path), "stall": 0.0, "seed": 1},
            opt="-O0",
        )
        diffs = res.get("expected_mismatches", []) + res.get("first_mismatches", [])
        beats = sum(len(r["expected"]) for r in self.rounds)
        mismatches = len(diffs) + (res.get("failed", 1) and not diffs)
        return {
            "layers": len(self.rounds),
            "beats": beats,
            "rtl_beats": res.get("beats"),
            "mismatches": mismatches,
            "first_mismatch": diffs[0]
            if diffs
            else (None if not mismatches else f"testbench failed, see {res.get('log')}"),
            "params": dataclasses.asdict(sp),
            "log": res.get("log"),
        }
