"""Defences against dishonest users and nodes: checks that cost an honest user nothing.

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
``sums``            int64 sums of fixed-point reports that refuse to wrap around
                    (:class:`~.sums.ReportOverflowError`)
``reports``         checks on one user's report (range, own draw) and the round's tally of
                    refused and clipped reports (the ``metrics.jsonl`` entries)
``budget``          the per-user claim budget across a run (what one user may claim on the
                    elements selected)
``guard``           one run's per-user checks and budgets together, for a party that sees
                    single users' reports (a node; the server for one-user replies)
``node_bounds``     what the server checks on a node's sum (cohort mode, secure aggregation)
``profiles``        the declared range in force, and the users' profiles committed (clipped
                    to it) at setup
``history``         FedSM's history clamp (on by default): a round's estimated gain held
                    to the mean of that element's estimates so far plus c standard errors
                    (submodular gains only shrink)
==================  ==========================================================================

The threat model these serve, and what each bound is worth against which attack, is in the
strategies' pages (``docs/strategies/fedsm.md``, ``docs/strategies/fedcg.md``); the numbers
come from ``benchmarks/robustness.py``.
"""
