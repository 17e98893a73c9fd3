"""The package's one atomic write: whole or not at all, with the mode open() would give."""

from __future__ import annotations

import os
import stat

import pytest

from flower_app.files import atomic_file, atomic_write_text


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_has_the_mode_the_umask_gives(tmp_path, umask, mode) -> None:
    """A ledger or checkpoint written under ``umask 077`` stays the owner's alone."""
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "sub" / "f.json", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "sub" / "f.json").stat().st_mode) == mode
    assert (tmp_path / "sub" / "f.json").read_text() == "{}\n"


def test_a_block_that_raises_leaves_the_old_file_and_no_temporary_one(tmp_path) -> None:
    dest = tmp_path / "checkpoint.npz"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(dest, sync=True) as out:
        out.write(b"half")
        raise RuntimeError("killed")
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz"]
    with atomic_file(dest, sync=True) as out:
        out.write(b"new")
    assert dest.read_bytes() == b"new" and len(list(tmp_path.iterdir())) == 1
