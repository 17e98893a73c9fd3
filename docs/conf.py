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
autodoc_typehints = "none"
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
     r"pathlib|collections|typing|concurrent|datetime|argparse|logging|enum)(\..*)?"),
    # checked: flower_app.strategies[.X] and flower_app.clients[.X] (exports, and the modules
    # the strategy pages render); not: anything deeper or elsewhere in flower_app
    (r"py:.*", r"flower_app\.(?!(strategies|clients)(\.\w+)?$).*"),
    (r"py:class", r"[^.]*"),
]
