"""A Flower app: Fashion-MNIST with FedAvg, switched to MaxFL."""
