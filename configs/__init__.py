"""Named configs, installed as package data of ``fsedp.configs``: ``hardware/``,
``models/``, ``scheduler/`` (one section each), ``experiments/`` (paper figures as sweeps),
run configs (``run-*.yaml``) and ``bad/`` (refused configs, one reason each).  Read through
:func:`fsedp.config.config_path`, never through the source tree."""
