"""FedSubAvg (Ding et al., NeurIPS 2022): federated learning with hot and cold features.

=================  ============================================================================
module             what it holds
=================  ============================================================================
``core``           Algorithm 1 and the baselines on submodels: client sampling, the feature
                   heat n_m (and W_m, App. D.4), the clients' local SGD on the MovieLens
                   task, the server steps (FedSubAvg's N/n_m correction, FedAvg / FedProx /
                   FedAdam on submodels, the SCAFFOLD approximation of App. D.2, CentralSGD
                   and its run), the evaluation and a run's spec
``named``          a model of named arrays (embedding tables + dense layers) on the flat
                   vector the server steps act on
``dp``             client-level DP on submodels: clipped updates, noise on the heat support
``torch_engine``   the torch tasks' local training, the run's rows and CentralSGD
``torch_tasks``    the torch tasks (Section 5: Sent140 with an LSTM, Amazon with DIN)
=================  ============================================================================
"""
