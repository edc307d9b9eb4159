"""Performance simulator of MoE layers on a chiplet array: FSE-DP (ablations A1-A8) on the
scheduler and streaming golden models, EP and Hydra baselines, hardware lower bounds.

* :mod:`.setup`: hardware and model timing from a run config (one source: ``RunConfig``);
* :mod:`.workload`: per-iteration, per-layer gate records from a routing trace;
* :mod:`.fsedp`: one MoE layer under FSE-DP, decision by decision (``fsedp.sw.scheduler``)
  and micro-slice by micro-slice (``fsedp.sw.streaming``, event-skipping);
* :mod:`.baselines`: EP and Hydra with double-buffered DDR streaming and Johnson ordering;
* :mod:`.run`: the main job: strategies side by side, metrics, report folder and plots.
"""
