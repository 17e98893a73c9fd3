"""FedCG's direct engine (FedCG, FedCG+, the federated discrete greedy): one process."""

from flower_app.runners.fedcg import direct_run

__all__ = ["direct_run"]
