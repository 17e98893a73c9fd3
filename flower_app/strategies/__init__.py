"""Flower strategies (Message API), one module per family."""
