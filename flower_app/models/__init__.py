"""Torch models (added by the learning strategies)."""
