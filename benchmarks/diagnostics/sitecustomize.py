"""Diagnosis only: shorten the simulation engine's message poll to show it is a round's floor.

Flower 1.42's simulation engine moves the ServerApp's messages to its workers in
``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``, which looks for new
messages and then waits a hard-coded 0.1 s (``f_stop.wait(0.1)``). A round whose work is
shorter than that waits for the next look, so a simulated round takes at least ~0.1 s.

Put this directory first on ``PYTHONPATH`` when running a benchmark and the ``flwr-simulation``
process (and only it) replaces that loop with the same loop waiting 5 ms. The path must be
absolute (Flower's processes run in other folders), and a local SuperLink already running for
the ``FLWR_HOME`` keeps the environment it started with: use a fresh ``FLWR_HOME``::

    FLWR_HOME=$(mktemp -d) PYTHONPATH="$PWD/benchmarks/diagnostics" \\
        python benchmarks/fedsm_cost_growth.py --sizes 1000 --schemes batched --flower 2 16 \\
        --out /tmp/diagnosis

It changes Flower's code in memory, so it is never used by the app, the tests or the
recorded results other than the diagnosis rows docs/performance.md labels as such.
"""

import os
import sys

if sys.argv and os.path.basename(sys.argv[0]) == "flwr-simulation":
    import threading
    from queue import Queue

    from flwr.server.superlink.fleet.vce import vce_api

    def add_messages_to_queue(
        state: object, queue: Queue, nodes_mapping: dict, f_stop: threading.Event
    ) -> None:
        """Flower's loop, waiting 5 ms instead of 0.1 s between looks."""
        while not f_stop.is_set():
            for node_id in nodes_mapping:
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
            f_stop.wait(0.005)

    vce_api.add_messages_to_queue = add_messages_to_queue
