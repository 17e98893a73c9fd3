"""What several algorithm families use.

=================  ============================================================================
module             what it holds
=================  ============================================================================
``counts``         counts given as fractions or absolute numbers (K clients, d elements)
``streams``        the users' random streams ``default_rng([seed, round, user, *purpose])``
                   (nothing else decides a draw), for every family
``greedy_step``    the federated greedy servers' shared step: check (seed, k), add the best
                   feasible element (FedSM Algorithm 1, FedCG's discrete greedy)
``threads``        torch on one thread for the clients' local training (MaxFL, FedSubAvg's
                   torch tasks)
``dp_noise``       where DP noise comes from: OS entropy on the node (a seed only in the
                   research mode ``dp-reproducible-noise``)
``gaussian_dp``    client-level DP by clipping and distributed Gaussian noise, and its
                   Rényi-DP accountant (MaxFL's and FedSubAvg's families)
=================  ============================================================================
"""
