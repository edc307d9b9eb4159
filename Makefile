# Two commands on a fresh machine: `make run` (the main job) and `make test` (the suite).
# Both create and fill the local virtual environment .venv on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow bench results verilog lint mutation mutation-changed clean distclean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# setuptools' notice that an editable install of mapped folders (fsedp.hw = hw/, ...)
	@# goes through an import hook is information, not a problem: filtered, all else shown
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e '.[test,model]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/fsedp run

# one worker per core (at most 4; each test file on one worker, so a file's fixtures and
# build folders are never shared between processes)
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n auto --maxprocesses 4 --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# Benchmarks (figures, not pass/fail): scheduler latency, cells, and area, timing and power
# in a real library and on an FPGA (docs/rtl-report.md),
# datapath streaming time, cells and long cosimulations with one package DDR channel
# (docs/datapath-report.md) and a channel per chiplet (docs/datapath-report-ddr-per-chiplet.md),
# and the simulator's speed, the Python model against the compiled engine
# (docs/performance-bench.md).
# The real-library tables of docs/rtl-report.md map to LIBERTY (SKY130 HD from the shared
# data folder when it is there; `make bench LIBERTY=FILE` names another; without one the
# report has no library tables) and place and route on the ECP5 (the 'fpga' extra, installed
# here; Debian's yosys needed).
LIBERTY ?= ../shared/data/liberty/sky130_fd_sc_hd__tt_025C_1v80.lib
FPGA_STAMP := $(VENV)/.installed-fpga

$(FPGA_STAMP): $(STAMP)
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e '.[test,model,fpga]'
	@touch $(FPGA_STAMP)

bench: $(STAMP) $(FPGA_STAMP)
	$(BIN)/fsedp rtl report --count-width 10 --experts 64,128 --chiplets 4,16 \
	  --sorters shuffle2,shuffle,stage,parallel \
	  $(if $(wildcard $(LIBERTY)),--liberty $(LIBERTY) --activity) \
	  $(if $(shell command -v yosys),--fpga) --out docs/rtl-report.md
	$(BIN)/fsedp rtl datapath --mesh 2x2:1000 --mesh 4x4:100 --reset-every 20 --out docs/datapath-report.md
	$(BIN)/fsedp rtl datapath --no-ring --ddr-per-chiplet --mesh 2x2:1000 --mesh 4x4:100 --reset-every 20 --out docs/datapath-report-ddr-per-chiplet.md
	$(BIN)/fsedp bench --e2e 100 --out docs/performance-bench.md

# The tables of docs/results.md, one per experiment file (configs/experiments/), rewritten
# between their markers from the same runs as `fsedp run --config FILE` (finished points from
# the sweep cache); `fsedp results docs/results.md --check` checks without running anything.
results: $(STAMP)
	$(BIN)/fsedp results docs/results.md

# Automated mutation testing of the rule modules (mutmut, scripts/mutation.toml): the score
# table of docs/verification.md rewritten for the modules run (all of them, or those named by
# MODULES="sw/eit.py sim/regions.py"); `make mutation-changed` runs the modules that differ
# from main, the check before a change is finished (docs/verification.md).
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py --doc docs/verification.md $(MODULES)

mutation-changed: $(STAMP)
	$(BIN)/python scripts/mutation.py --changed main

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

verilog: $(STAMP)
	$(BIN)/fsedp rtl verilog --out build/verilog --lint

clean:
	rm -rf build .pytest_cache

distclean: clean
	rm -rf $(VENV) *.egg-info
