"""A Flower deployment rehearsed on one machine (not installed: a checkout's folder).

A TLS + node-authentication SuperLink and SuperNodes (:class:`SecureFederation`), each
SuperNode a separate edge device with its network namespace and cgroup limits
(:class:`Rehearsal`, :mod:`rehearsal.isolation`), every process supervised
(:class:`Supervisor`: reaped at once, what a dead one left stopped), failure drills
(:mod:`rehearsal.drills`) and peak memory per process (:class:`PeakRSS`). The ``deploy``
tests and ``benchmarks/deploy_rounds.py`` run on it; ``python -m rehearsal start`` and
``python -m rehearsal drill`` from the repository's root. The credentials it uses are the
package's (:mod:`flower_app.deploy`).
"""

from rehearsal.federation import SecureFederation
from rehearsal.processes import (
    ManagedProcess,
    PeakRSS,
    register_node,
    start_process,
    superlink_command,
    supernode_command,
    write_connection,
)
from rehearsal.rehearsal import EDGE_DEVICE, EdgeDevice, Rehearsal
from rehearsal.supervisor import Death, Supervisor

__all__ = [
    "EDGE_DEVICE",
    "Death",
    "EdgeDevice",
    "ManagedProcess",
    "PeakRSS",
    "Rehearsal",
    "SecureFederation",
    "Supervisor",
    "register_node",
    "start_process",
    "superlink_command",
    "supernode_command",
    "write_connection",
]
