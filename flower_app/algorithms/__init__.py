"""Algorithm math as plain numpy functions, shared by the strategies and the direct engines.

No module here imports Flower. One subpackage per family; each one's docstring maps its
modules to the paper's algorithm numbers:

============  ==============================================================================
subpackage    what lives there
============  ==============================================================================
``fedsm``     FedSM (Rafiey, Namani & Charalambides, 2025): Algorithms 1, 2 and 3, the
              three modes behind one round protocol, the users' draws, one user with any
              utility, shuffle-model DP (Appendix C)
``fedcg``     FedCG / FedCG+ (Rafiey, ICML 2024, Algorithms 1 and 2) and the federated
              discrete greedy with importance factors (Algorithms 3, 4, 5)
``maxfl``     MaxFL (Cho et al., TMLR 2024, Algorithm 1), its baselines' server steps,
              the clients' local training, the round protocol shared by both engines
``fedsubavg`` FedSubAvg (Ding et al., NeurIPS 2022, Algorithm 1) and its baselines on
              submodels: server steps, CentralSGD, named-array models, DP, the torch
              tasks (Sent140 LSTM, Amazon DIN)
``common``    what several families use: counts given as fractions, the users' random
              streams, the greedy servers' step (best feasible element), torch on one
              thread, where DP noise comes from, client-level Gaussian DP with its
              accountant
``robust``    the submodular families' defences against dishonest users and nodes:
              overflow-checked sums, range and draw checks, per-user claim budgets, the
              bounds on a node's sum, profiles committed at setup
============  ==============================================================================
"""
