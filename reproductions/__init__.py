"""Reproductions of the four papers: ``run_sim.py``'s commands (not part of the library).

:mod:`reproductions.cli` is the command line; :mod:`reproductions.sweep` is the one skeleton
every command runs on (a grid of runs, resumed, named, collected into CSV tables, drawn);
each paper's module holds its grid, its rows, its tables and figures and its options. A
command offers, in ``--dataset``, exactly the datasets it can run
(:func:`reproductions.sweep.runnable_datasets` of its algorithm).

Not installed with ``flower_app`` and not in the app's FAB: run from the repository
(``python run_sim.py ...``, or ``python -m reproductions.<module>`` from its root).
"""
