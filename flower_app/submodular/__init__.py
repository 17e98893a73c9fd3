"""Decomposable submodular objectives, matroids and centralized baselines."""
