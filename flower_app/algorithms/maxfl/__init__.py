"""MaxFL (Cho, Jhunjhunwala, Li, Smith & Joshi, TMLR 2024) and the baselines of its paper.

=================  ============================================================================
module             what it holds
=================  ============================================================================
``core``           MaxFL's math: the aggregation weight q_k (Eq. 4), the adaptive global
                   learning rate and server step (Algorithm 1), the objective (Eq. 3) and
                   GM-Appeal (Eq. 1)
``baselines``      the baselines' server steps: FedAvg, FedProx, q-FFL, SCAFFOLD, MW-Fed
``server_rules``   one :class:`~.server_rules.ServerRule` per algorithm: what the clients
                   receive, which replies are valid, how the sums move the server's state
``learning``       the clients' side of a round: one :class:`~.learning.LocalRule` per
                   algorithm (which local steps, what the client sends), the solo model
                   that sets ρ_k, the locally-tuned evaluation (Table 3)
``local_steps``    the clients' optimisers on the MLP: local SGD (with FedProx's and
                   SCAFFOLD's terms; one by one or batched), Per-FedAvg's and pFedMe's
                   steps
``participation``  which seen clients train in a round (flexible participation, Section 3,
                   Table 1)
``appeal``         the round protocol written once for both engines (opt-in, sampling,
                   training, step, evaluation) and the server state
                   (:class:`~.appeal.AppealServer`)
=================  ============================================================================
"""
