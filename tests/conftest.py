import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# the product reads corpora only from a folder the user names; the tests name the shared one
if SHARED_DATA.exists():
    os.environ.setdefault("FSEDP_DATA", str(SHARED_DATA))


@pytest.fixture(autouse=True, scope="session")
def _point_cache(tmp_path_factory):
    """Sweeps run by the tests cache their points in a folder of this session, never in the
    user's cache."""
    old = os.environ.get("FSEDP_CACHE")
    os.environ["FSEDP_CACHE"] = str(tmp_path_factory.mktemp("point-cache"))
    yield
    if old is None:
        os.environ.pop("FSEDP_CACHE", None)
    else:
        os.environ["FSEDP_CACHE"] = old
