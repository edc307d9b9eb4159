"""Writing user-visible files so that nothing half-written is left behind."""

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path, suffix: str = ""):
    """Yield a temporary path next to ``path``; on success it is renamed to ``path``, on an
    exception it is removed.  ``suffix`` keeps an extension some writers insist on
    (``numpy.savez`` appends ``.npz`` to names without it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or path.suffix,
                               dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)          # mkstemp makes 0600; a written file is a normal one
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
