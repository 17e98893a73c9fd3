"""Sphinx configuration of the flower_app documentation site (``docs/``).

Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

Why Sphinx + MyST (and not MkDocs): the pages stay the Markdown files they were (MyST reads
them as they are, GitHub renders them too), the API reference is rendered by autodoc +
napoleon from the numpy-style docstrings (the strategies' message contracts are tables in
their docstrings, in reStructuredText, which only Sphinx renders), ``-n`` (nitpicky) turns
every unresolved cross-reference into a warning, and Flower's own documentation is built the
same way. See ``docs/development.md``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

project = "flower_app"
author = "the flower_app authors"
copyright = "the flower_app authors, Apache-2.0"  # noqa: A001 - Sphinx's name

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# generated result tables (benchmark scripts' outputs beside their JSON/CSV); the pages that
# discuss them (performance.md, privacy.md) show them
exclude_patterns = [
    "_build",
    "benchmarks/fedsm-growth*.md",
    "benchmarks/pins-hot-paths.md",
    "benchmarks/secure-aggregation-overhead.md",
    "benchmarks/privacy/*.md",
]

# Markdown: anchors for '#section' links (GitHub's slugs), ::: fences for directives
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# numpy-style docstrings; types in signatures, not repeated in the text
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"show-inheritance": True}

html_theme = "furo"
html_title = "flower_app"
html_static_path: list[str] = []

# -n (nitpicky): every cross-reference into the documented API (flower_app.strategies,
# flower_app.clients) must resolve. Not checked, because this site has no page for them: other
# packages' objects (no network for their inventories), the package's internal modules (the
# site documents the user-facing API only; such references render as code), and the
# plain-language types of numpy-style docstrings ("int, optional", "sequence of str",
# "Grid", "AppealServer").
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(flwr|numpy|np|torch|pandas|pd|scipy|matplotlib|dp_accounting|cryptography|"
     r"pathlib|collections|typing|concurrent|datetime|argparse|logging|enum|random|abc)(\..*)?"),
    # checked: flower_app.strategies[.X] and flower_app.clients[.X] (exports, and the modules
    # the strategy pages render); not: anything deeper or elsewhere in flower_app
    (r"py:.*", r"flower_app\.(?!(strategies|clients)(\.\w+)?$).*"),
    (r"py:class", r"[^.]*"),
]


# ---------------------------------------------------------------- message-contract tables
# The strategies' message-contract tables (FedSMStrategy, FedSubAvgStrategy, the module
# docstring of flower_app.strategies.fedcg) are reST simple tables written for a terminal:
# a message's first-column label runs over several lines (``query.`` / ``cohort``,
# ``train`` / (setup)). docutils would make each such line a row of its own, so before
# rendering, the lines of one label are joined into the row's first line. In a table whose
# first header cell starts with "message", a line starts a new row when its first-column
# text starts with a literal (``...``) that does not continue a label ending in ".``", or
# is "reply"; any other first-column text continues the row above.


def _join_contract_labels(lines: list[str]) -> list[str]:
    import re

    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        border = re.fullmatch(r"(=+)((?:\s+=+)+)\s*", line)
        if not border or i + 1 >= len(lines):
            out.append(line)
            i += 1
            continue
        starts = [m.start() for m in re.finditer(r"=+", line)]
        header = lines[i + 1]
        end = next((j for j in range(i + 2, len(lines)) if lines[j] == line), None)
        if not header[: starts[1]].strip().startswith("message") or end is None:
            out.append(line)
            i += 1
            continue
        second = next(j for j in range(end + 1, len(lines)) if lines[j] == line)
        rows: list[list[str]] = []  # each row: [label parts, line rests...]
        body = lines[end + 1 : second]
        labels: list[list[str]] = []
        for text in body:
            head, rest = text[: starts[1]].strip(), text[starts[1] :]
            previous = labels[-1][-1] if labels and labels[-1] else ""
            new_row = head == "reply" or (
                head.startswith("``") and not previous.endswith(".``")
            )
            if new_row or not rows:
                rows.append([rest])
                labels.append([head] if head else [])
            else:
                rows[-1].append(rest)
                if head:
                    labels[-1].append(head)
        joined = [" ".join(parts).replace(".`` ``", ".") for parts in labels]
        width = max(starts[1] - 2, *(len(label) for label in joined))
        shift = width + 2 - starts[1]

        wide = "=" * width + line[starts[1] - 2 :]
        out += [wide, header[: starts[1]].ljust(width + 2) + header[starts[1] :], wide]
        for label, rest_lines in zip(joined, rows, strict=True):
            for k, rest in enumerate(rest_lines):
                out.append(((label if k == 0 else "").ljust(width + 2) + rest).rstrip())
        out.append(wide)
        assert shift >= 0
        i = second + 1
    return out


def _contract_tables(app, what, name, obj, options, lines) -> None:  # noqa: ANN001
    lines[:] = _join_contract_labels(list(lines))


def setup(app):  # noqa: ANN001, ANN201
    """Register the contract-table joining for autodoc's docstrings."""
    app.connect("autodoc-process-docstring", _contract_tables)
