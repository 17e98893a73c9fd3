"""Writing a file whole or not at all: the package's one atomic write.

Downloads, caches, extracted data files, node files, the run folder's ``config.json`` and
``summary.json``, checkpoints, the node's privacy ledger and the local SuperLink's ports
file are all written through :func:`atomic_file`, so a reader (or a run resumed after a
kill) sees either the old file or the new one, never a part.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "atomic_write_text"]


@contextlib.contextmanager
def atomic_file(dest: str | os.PathLike[str], *, sync: bool = False) -> Iterator[IO[bytes]]:
    """Yield a temporary file beside ``dest`` that becomes ``dest`` when the block ends.

    When the block ends normally the temporary file (``.<name>.<random>.part``) is flushed,
    forced to the disk if ``sync``, given the mode ``open()`` would have created it with
    (0666 less the process's umask: 0644 by default, 0600 under ``umask 077``) and renamed
    onto ``dest``, so a reader never sees a partial file; when it raises, the temporary file
    is deleted and ``dest`` is left as it was. ``dest``'s folder is created if needed.

    Parameters
    ----------
    dest : str or os.PathLike
        The file to replace.
    sync : bool, optional
        ``fsync`` the file before the rename (default False: the rename alone protects
        against a killed process; ``sync`` also against a power loss).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            yield out
            out.flush()
            if sync:
                os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _umask() -> int:
    """Return the process's umask, read without changing it (Linux: /proc; else 022)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def atomic_write_text(dest: str | os.PathLike[str], text: str, *, sync: bool = False) -> None:
    """Replace ``dest`` with ``text`` (UTF-8) through :func:`atomic_file`."""
    with atomic_file(dest, sync=sync) as out:
        out.write(text.encode("utf-8"))
