"""Sorting a round's replies into accepted ones and ones left out (DESIGN principle 6).

Kept for imports of the earlier layout; the implementation lives in
:mod:`flower_app.strategies.base` with the strategy loop that uses it.
"""

from flower_app.strategies.base import CheckedReplies, check_replies

__all__ = ["CheckedReplies", "check_replies"]
