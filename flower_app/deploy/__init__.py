"""Deploy the app on real SuperNodes: certificates, node keys, secure SuperLink/SuperNodes.

``python -m flower_app.deploy certs --out DIR --host HOST_OR_IP`` and
``python -m flower_app.deploy node-keys --out DIR --count N`` make the credentials;
:mod:`flower_app.deploy.processes` builds and runs the ``flower-superlink`` /
``flower-supernode`` commands of ``docs/deployment.md``; :class:`SecureFederation` runs a
whole TLS + node-authentication federation on one machine (the ``deploy`` tests).
"""

from flower_app.deploy.credentials import (
    Certificates,
    NodeKey,
    make_certificates,
    make_node_keys,
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

__all__ = [
    "Certificates",
    "ManagedProcess",
    "NodeKey",
    "PeakRSS",
    "SecureFederation",
    "connection_toml",
    "make_certificates",
    "make_node_keys",
    "register_node",
    "start_process",
    "superlink_command",
    "supernode_command",
    "write_connection",
]
