"""FedSM (Rafiey, Namani & Charalambides, 2025): federated submodular maximisation by sampled gains.

=================  ============================================================================
module             what it holds
=================  ============================================================================
``core``           Algorithm 1: the server step (:class:`~.core.FedSMServer`: scale the summed
                   reports, add the best feasible element), the users' step
                   (:func:`~.core.user_report_sum`), report encoding
``alg2``           Algorithm 2 (O(log m) rounds, Section 4): random feasible sequences,
                   thresholds, the pairs users report (:class:`~.alg2.FedSMAlg2Server`)
``amplify``        Algorithm 3 (Appendix B): the users' values of the surrogate g (exact
                   multilinear or sampled) for Algorithm 1 or 2 inside
``modes``          the three modes behind one round protocol (:class:`~.modes.FedSMRun`, the
                   server; :func:`~.modes.cohort_report`, what a cohort of users sends); the
                   Flower strategy and the direct engine use the same two
``sampling``       the users' draws of elements / pairs: per-user generators or the batched
                   counter-based scheme (``fedsm-rng``)
``user``           one user with any utility (plain mode: one node, one client)
``dp``             Algorithm 1 under shuffle-model DP (Appendix C, Proposition C.1)
``shuffle_dp``     the shuffle-model protocol of Cheu et al. it uses: randomiser, debiasing,
                   calibration and accounting (FedSM is its only user)
=================  ============================================================================
"""
