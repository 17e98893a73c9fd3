"""fedavg-anchor: Flower's quickstart-numpy FedAvg, timed per round."""
