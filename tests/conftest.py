import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# testbench modules live in tb/ (not a package of the product)
sys.path.insert(0, str(ROOT / "tb"))
