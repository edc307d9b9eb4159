"""Verification: cocotb testbenches (``tb_<block>.py``) run on the generated Verilog under
Verilator or Icarus against the golden models, the runner that builds and starts them
(:mod:`.runner`), the stream drivers and monitors they share (:mod:`.streams`) and the
scoreboards that check RTL against model (:mod:`.scoreboard`, :mod:`.datapath_scoreboard`).

Installed as ``fsedp.tb`` so that ``fsedp rtl ...`` finds the testbenches from a wheel."""
