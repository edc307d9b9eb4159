import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# the product reads corpora only from a folder the user names; the tests name the shared one
if SHARED_DATA.exists():
    os.environ.setdefault("FSEDP_DATA", str(SHARED_DATA))
