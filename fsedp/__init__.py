"""FSE-DP co-design toolkit: golden models, Amaranth RTL, cocotb verification, a performance
simulator and the companion papers' policies for MoE inference on multi-chiplet
accelerators.  ``docs/architecture.md`` draws the layers; ``fsedp --help`` lists the
commands."""
