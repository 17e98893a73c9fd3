"""FedCG (Rafiey, ICML 2024, "Decomposable Submodular Maximization in Federated Setting").

===================  ==========================================================================
module               what it holds
===================  ==========================================================================
``continuous``       FedCG (Algorithm 1) and FedCG+ (Algorithm 2, τ local steps): the users'
                     continuous-greedy directions (their gradients, exact or sampled, by
                     :mod:`flower_app.submodular.multilinear`), the server step
                     (:class:`~.continuous.FedCGServer`), the oblivious rounding at the end
                     (Remark 4.4)
``discrete_greedy``  the federated discrete greedy with importance factors: the histogram
                     and importance factors (Algorithms 4 and 5), the greedy rounds with
                     participation probabilities (Algorithm 3)
                     (:class:`~.discrete_greedy.DiscreteGreedyServer`)
===================  ==========================================================================
"""
