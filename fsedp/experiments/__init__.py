"""Experiment drivers: each runs a golden model, a policy or the RTL over a workload and
turns the outcome into the tables and plots of one command (``fsedp offload``, ``prism``,
``serve``, ``shuffle``, ``rtl report``, ``rtl datapath``; ``rtl_runs``: the testbench,
Verilator, Yosys and formal runs of the other ``rtl`` commands and the text of their
results)."""
