"""fedavg-anchor-torch: Flower's quickstart-pytorch FedAvg on MaxFL's MLP, timed per round."""
