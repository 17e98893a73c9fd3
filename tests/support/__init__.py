"""Test harnesses: what the tests run the app on, never installed with the package.

``inprocess_simulation``
    :class:`~tests.support.inprocess_simulation.InProcessSimulation`: this app on Flower's
    simulation engine in the test process (Flower's internal ``_run_simulation``), its
    ClientApps in actors of a Ray cluster that stays up between runs.
``ray_cluster``
    :class:`~tests.support.ray_cluster.LoopbackRayCluster`: a Ray head and raylets on
    loopback, started and stopped by PID.
``process_sweep``
    The test run's token, and the watchdog that stops every process the run started
    however the run ends.
``local_grid``
    :class:`~tests.support.local_grid.LocalGrid`: an in-process Grid that calls the real
    ClientApp per message (no Ray).
``deployment``
    The deployment fixtures: the edge-device rehearsals, per-node exports, an insecure
    loopback deployment.
"""
