"""Deploy the app on real SuperNodes: certificates, node keys, secure-aggregation identities.

``python -m flower_app.deploy certs --out DIR --host HOST_OR_IP``,
``python -m flower_app.deploy node-keys --out DIR --count N`` and, for secure aggregation's
endorsed keys, ``identity-keys`` and ``trusted-keys`` make the credentials of
``docs/deployment.md``; ``connection`` prints the ``flwr`` CLI's entry for the SuperLink.
A whole TLS + node-authentication federation on one machine (the edge-device rehearsal, its
supervisor and failure drills) is the repository's ``rehearsal/``, not installed.
"""

from flower_app.deploy.connection import connection_toml
from flower_app.deploy.credentials import (
    Certificates,
    IdentityKey,
    NodeKey,
    make_certificates,
    make_identity_keys,
    make_node_keys,
    write_trusted_keys,
)

__all__ = [
    "Certificates",
    "IdentityKey",
    "NodeKey",
    "connection_toml",
    "make_certificates",
    "make_identity_keys",
    "make_node_keys",
    "write_trusted_keys",
]
