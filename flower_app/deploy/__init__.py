"""Deploy the app on real SuperNodes: certificates, node keys, secure SuperLink/SuperNodes.

``python -m flower_app.deploy certs --out DIR --host HOST_OR_IP``,
``python -m flower_app.deploy node-keys --out DIR --count N`` and, for secure aggregation's
endorsed keys, ``identity-keys`` and ``trusted-keys`` make the credentials;
:mod:`flower_app.deploy.processes` builds and runs the ``flower-superlink`` /
``flower-supernode`` commands of ``docs/deployment.md``; :class:`SecureFederation` runs a
whole TLS + node-authentication federation on one machine (the ``deploy`` tests), its
processes supervised (:class:`Supervisor`: reaped at once, what a dead one left stopped).
"""

from flower_app.deploy.credentials import (
    Certificates,
    IdentityKey,
    NodeKey,
    make_certificates,
    make_identity_keys,
    make_node_keys,
    write_trusted_keys,
)
from flower_app.deploy.federation import SecureFederation
from flower_app.deploy.processes import (
    ManagedProcess,
    PeakRSS,
    connection_toml,
    register_node,
    start_process,
    superlink_command,
    supernode_command,
    write_connection,
)
from flower_app.deploy.supervisor import Death, Supervisor

__all__ = [
    "Certificates",
    "Death",
    "IdentityKey",
    "ManagedProcess",
    "NodeKey",
    "PeakRSS",
    "SecureFederation",
    "Supervisor",
    "connection_toml",
    "make_certificates",
    "make_identity_keys",
    "make_node_keys",
    "register_node",
    "start_process",
    "superlink_command",
    "supernode_command",
    "write_connection",
    "write_trusted_keys",
]
