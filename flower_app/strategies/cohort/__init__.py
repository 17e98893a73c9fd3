"""The cohort strategies: a node serves many users (this app's simulations at scale).

A dataset's users are split over the ``num-partitions`` SuperNodes; before round 1 the
server asks every node which users it serves (``query.cohort``, discovery), then samples
*users* with its own seeded generator, and a node replies with the sum over its sampled
users (what secure aggregation would reveal anyway). The runners of
:mod:`flower_app.runners` use these classes; a Flower project uses the public, plain
strategies of :mod:`flower_app.strategies` (one node = one client).

==========================  ===========================================================
class                       family (module)
==========================  ===========================================================
``CohortStrategy``          their base: discovery, re-discovery before every round, the
                            sampled users grouped by node (:mod:`.base`)
``FedSMCohorts``            FedSM, Algorithms 1-3 (:mod:`.fedsm`)
``FedCGCohorts``            FedCG / FedCG+ from a server state (:mod:`.fedcg`)
``DiscreteGreedyCohorts``   the discrete greedy with importance factors
                            (:mod:`.discrete_greedy`)
``MaxFLCohorts``            MaxFL and its baselines, seen and unseen clients (:mod:`.maxfl`;
                            exported as ``flower_app.strategies.AppealStrategy`` too)
``FedSubAvgCohorts``        FedSubAvg and its baselines (:mod:`.fedsubavg`; the exchanges'
                            messages: :mod:`.fedsubavg_exchanges`)
==========================  ===========================================================

They share the maths (:mod:`flower_app.algorithms`) and the round loop
(:class:`~flower_app.strategies.base.RoundStrategy`) with the public strategies, and their
exchange code as functions or small mixins of the public modules; no cohort class derives
from a public strategy.
"""
