"""Sweeps: many runs of one family, their CSV tables and plots (hooked into run_sim.py)."""
