"""Runners: how each algorithm family runs on the ServerApp, the ClientApp and the direct engine."""
