"""FedSubAvg (Ding et al., NeurIPS 2022): federated learning with hot and cold features.

=================  ============================================================================
module             what it holds
=================  ============================================================================
``core``           Algorithm 1 and the baselines on submodels: client sampling, the feature
                   heat n_m (and W_m, App. D.4), the clients' local SGD on the MovieLens
                   task, the server steps (FedSubAvg's N/n_m correction, FedAvg / FedProx /
                   FedAdam on submodels, the SCAFFOLD approximation of App. D.2, CentralSGD)
                   and the evaluation
``direct``         the direct engine: all sampled clients of a round in one vectorised call
``named``          a model of named arrays (embedding tables + dense layers) on the flat
                   vector the server steps act on
``dp``             client-level DP on submodels: clipped updates, noise on the heat support
``torch_engine``   the torch tasks' local training and both engines (direct, and the real
                   strategy over a Flower Grid)
``torch_tasks``    the torch tasks (Section 5: Sent140 with an LSTM, Amazon with DIN)
=================  ============================================================================
"""
