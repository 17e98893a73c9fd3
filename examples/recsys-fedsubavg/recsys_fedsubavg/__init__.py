"""recsys-fedsubavg: a PyTorch recommender trained with FedAvg, then FedSubAvg."""
