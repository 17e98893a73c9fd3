"""What ``flwr run`` walks and packages of an app folder: warnings before it starts.

``flwr run`` builds the app package (FAB) from the app folder (flwr 1.42,
``flwr/cli/utils.py`` ``collect_files`` and ``flwr/cli/build.py``): it walks **every** file
of the folder (symlinks skipped), then keeps those its rules include (``.py``, ``.toml``,
``.md``, ``.json``, ``.jsonl``, ... minus ``.gitignore``'s patterns, ``.venv/``,
``__pycache__/``, and ``fab-include`` / ``fab-exclude`` of ``[tool.flwr.app]``), and refuses
a package over 10 MB with a message that names no file. So:

- a virtual environment inside the folder (a directory holding ``pyvenv.cfg``, whatever its
  name) is walked file by file on every run, tens of seconds on a busy machine, even when
  its name (``.venv``, ``venv``, ``env`` at the top) keeps it out of the package; under any
  other name its ``.py`` files are packaged and the run is refused;
- data files the rules include (``.json`` LEAF files, ...) count towards the 10 MB.

:func:`app_folder_warnings` finds both without walking into a virtual environment (one
``os.walk`` of the rest, with Flower's own patterns, copied here and checked equal to
Flower's by ``tests/test_cli_app_folder.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["FAB_MAX_SIZE", "app_folder_warnings", "packaged_files"]

#: Flower's limit on a package (flwr.common.constant.FAB_MAX_SIZE)
FAB_MAX_SIZE = 10 * 1024 * 1024
#: flwr.supercore.constant.APP_PUBLISH_INCLUDE_PATTERNS / _EXCLUDE_PATTERNS
PUBLISH_INCLUDE = ("**/*.py", "**/*.toml", "**/*.md", "**/*.yaml", "**/*.yml", "**/*.json",
                   "**/*.jsonl", "/.gitignore", "**/.editorconfig", "/LICENSE",
                   "/LICENSE.md")  # fmt: skip
PUBLISH_EXCLUDE = (".flwr/**", ".venv/**", "**/__pycache__/**")
#: flwr.common.constant.FAB_INCLUDE_PATTERNS / FAB_EXCLUDE_PATTERNS
FAB_INCLUDE = ("**/*.py", "**/*.toml", "**/*.md", "**/*.yaml", "**/*.yml", "**/*.json",
               "**/*.jsonl", "/LICENSE")  # fmt: skip
FAB_EXCLUDE = (".flwr/**", "**/__pycache__/**", "pyproject.toml", "**/*_test.py",
               "**/test_*.py", "build/**", "eggs/**", ".eggs/**", "lib/**", "lib64/**",
               "parts/**", "*.egg", ".venv/**", "env/**", "venv/**", "ENV/**", "env.bak/**",
               "venv.bak/**")  # fmt: skip


def _spec(patterns: Any) -> Any:
    """Return Flower's pattern matcher (``flwr.cli.utils.build_pathspec``: gitwildmatch)."""
    import warnings

    import pathspec

    with warnings.catch_warnings():  # pathspec deprecates the factory Flower uses
        warnings.simplefilter("ignore", DeprecationWarning)
        return pathspec.PathSpec.from_lines("gitwildmatch", patterns)


def _walk(app_dir: Path) -> tuple[dict[str, int], list[str]]:
    """Return every file Flower would collect (relative path -> size) and the venvs.

    Like Flower's walk (symlinks skipped, never followed), but a directory holding
    ``pyvenv.cfg`` is not entered: it is listed among the venvs.
    """
    files: dict[str, int] = {}
    venvs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(app_dir, followlinks=False):
        here = Path(dirpath)
        if "pyvenv.cfg" in filenames and here != app_dir:
            venvs.append(here.relative_to(app_dir).as_posix())
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
        for name in filenames:
            path = here / name
            if path.is_symlink():
                continue
            try:
                files[path.relative_to(app_dir).as_posix()] = path.stat().st_size
            except OSError:
                continue
    return files, venvs


def _gitignore(app_dir: Path) -> list[str]:
    try:
        text = (app_dir / ".gitignore").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def packaged_files(app_dir: Path, app: dict[str, Any], files: dict[str, int]) -> dict[str, int]:
    """Return the files of ``files`` Flower would put into the package, with their sizes.

    Parameters
    ----------
    app_dir : pathlib.Path
        The app folder.
    app : dict
        ``[tool.flwr.app]`` of its ``pyproject.toml`` (``fab-include``, ``fab-exclude``).
    files : dict
        Relative path -> size of every file collected.
    """
    paths = list(files)
    paths = list(_spec(PUBLISH_INCLUDE).match_files(paths))
    paths = list(_spec(PUBLISH_EXCLUDE).match_files(paths, negate=True))
    paths = list(_spec(_gitignore(app_dir)).match_files(paths, negate=True))
    if app.get("fab-include"):
        paths = list(_spec(app["fab-include"]).match_files(paths))
    if app.get("fab-exclude"):
        paths = list(_spec(app["fab-exclude"]).match_files(paths, negate=True))
    include, exclude = _spec(FAB_INCLUDE), _spec(FAB_EXCLUDE)
    return {p: files[p] for p in paths if include.match_file(p) and not exclude.match_file(p)}


def _mb(size: float) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


def app_folder_warnings(app_dir: Path, app: dict[str, Any]) -> list[str]:
    """Return what in the app folder Flower would walk for long or refuse, one line each.

    Parameters
    ----------
    app_dir : pathlib.Path
        The app folder.
    app : dict
        ``[tool.flwr.app]`` of its ``pyproject.toml``.

    Returns
    -------
    list of str
        A virtual environment inside the folder (by its ``pyvenv.cfg``, whatever its name):
        walked on every run, and packaged (so refused) unless Flower's rules exclude it; the
        files to be packaged when they exceed Flower's 10 MB, the largest named.
    """
    files, venvs = _walk(app_dir)
    found = []
    exclude = _spec((*PUBLISH_EXCLUDE, *FAB_EXCLUDE, *app.get("fab-exclude", [])))
    for venv in venvs:
        kept_out = exclude.match_file(f"{venv}/lib/site.py")
        found.append(
            f"{app_dir / venv} is a virtual environment (it holds pyvenv.cfg) inside the app "
            "folder: flwr run walks every file of it on every run (tens of seconds on a busy "
            + ("machine); create it outside the app folder" if kept_out else
               "machine) and would package its .py files, then refuse the package as too "
               "large; create it outside the app folder")  # fmt: skip
        )
    packaged = packaged_files(app_dir, app, files)
    total = sum(packaged.values())
    if total > FAB_MAX_SIZE:
        largest = sorted(packaged, key=lambda p: -packaged[p])[:3]
        found.append(
            f"flwr run would package {_mb(total)} of {app_dir} (Flower refuses more than "
            f"{_mb(FAB_MAX_SIZE)}), most in " + ", ".join(
                f"{app_dir / p} ({_mb(packaged[p])})" for p in largest)
            + "; move data out of the app folder (data-dir, data-file) or add the paths to "
            "fab-exclude in [tool.flwr.app]"
        )  # fmt: skip
    return found
