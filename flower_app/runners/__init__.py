"""Runners: how each algorithm family runs on the ServerApp and the ClientApp."""
