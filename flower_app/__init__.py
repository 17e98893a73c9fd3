"""flower_app: Flower strategies for federated submodular maximisation, MaxFL and FedSubAvg."""
