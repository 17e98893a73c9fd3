"""TLS certificates and SuperNode authentication keys for a Flower deployment.

Both are made with the ``cryptography`` package (a dependency of ``flwr``), no ``openssl``
binary needed:

* :func:`make_certificates` writes a self-signed CA (``ca.crt``, ``ca.key``) and a server
  certificate signed by it (``server.pem``, ``server.key``) for one or more host names or IP
  addresses. The SuperLink takes ``--ssl-ca-certfile ca.crt --ssl-certfile server.pem
  --ssl-keyfile server.key``; SuperNodes and the ``flwr`` CLI take ``ca.crt`` as their root
  certificate.
* :func:`make_node_keys` writes SuperNode key pairs in the format Flower 1.41 expects: an
  OpenSSH private key on a NIST P-384 curve (``flower-supernode --auth-supernode-private-key``)
  and its OpenSSH public key (``flwr supernode register KEY.pub``), i.e. what
  ``ssh-keygen -t ecdsa -b 384 -N ""`` makes.
* :func:`make_identity_keys` writes each SuperNode's **identity** for secure aggregation: a
  P-384 private key in PEM (PKCS#8, node_config ``secagg-identity-key``) and its public key
  in PEM; :func:`write_trusted_keys` concatenates the federation's identity public keys into
  the file every node trusts (node_config ``secagg-trusted-keys``). With both, a node signs
  its secure-aggregation run key and accepts a neighbour's key only if a trusted identity
  signed it (``docs/privacy.md``, "How nodes know each other's keys"): the server can
  neither substitute keys nor invent nodes. An identity is not the node's authentication
  key (that one signs requests to the SuperLink, in OpenSSH format); they are kept apart.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "Certificates",
    "IdentityKey",
    "NodeKey",
    "make_certificates",
    "make_identity_keys",
    "make_node_keys",
    "read_public_keys",
    "write_trusted_keys",
]


@dataclass(frozen=True)
class Certificates:
    """Paths of the files :func:`make_certificates` wrote.

    Attributes
    ----------
    ca_cert : pathlib.Path
        The CA certificate (PEM): ``--ssl-ca-certfile`` of the SuperLink,
        ``--root-certificates`` of SuperNodes, ``root-certificates`` of a connection.
    ca_key : pathlib.Path
        The CA's private key (keep it offline; only needed to sign more certificates).
    server_cert : pathlib.Path
        The server certificate (PEM): ``--ssl-certfile`` of the SuperLink.
    server_key : pathlib.Path
        The server's private key (PEM): ``--ssl-keyfile`` of the SuperLink.
    """

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """One SuperNode's key pair.

    Attributes
    ----------
    private_key : pathlib.Path
        OpenSSH private key (``--auth-supernode-private-key``); stays on the node.
    public_key : pathlib.Path
        OpenSSH public key (``flwr supernode register``); goes to the SuperLink operator.
    """

    private_key: Path
    public_key: Path


@dataclass(frozen=True)
class IdentityKey:
    """One SuperNode's identity for secure aggregation's endorsed keys.

    Attributes
    ----------
    private_key : pathlib.Path
        P-384 private key, PEM (PKCS#8, mode 0600): node_config ``secagg-identity-key``;
        stays on the node.
    public_key : pathlib.Path
        Its public key, PEM: goes into the federation's trusted-key file
        (:func:`write_trusted_keys`), out of band (never through the SuperLink).
    """

    private_key: Path
    public_key: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _subject_alt_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


#: the flags of x509.KeyUsage; a certificate sets the ones it names and clears the others
_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    start: dt.datetime,
    end: dt.datetime,
    *,
    ca: bool,
    usages: tuple[str, ...],
) -> x509.CertificateBuilder:
    """Return what the CA and the SuperLink certificate share, ready for their own extensions.

    Names, key, a random serial, the validity, basic constraints (a CA signs leaves only:
    path length 0) and the key usages named in ``usages`` (both critical).
    """
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(**{name: name in usages for name in _KEY_USAGES}), critical=True
        )
    )


def make_certificates(out: Path, hosts: list[str], days: int = 365) -> Certificates:
    """Write a self-signed CA and a server certificate for ``hosts``.

    Parameters
    ----------
    out : pathlib.Path
        Output folder (created); existing files are overwritten.
    hosts : list of str
        Host names and/or IP addresses the SuperLink is reached at (the certificate's
        subject alternative names; the first is also its common name). Add every name
        clients will use, e.g. ``["superlink.example.org", "192.0.2.10"]``. ``127.0.0.1``
        and ``localhost`` are always added: in flwr 1.42 the SuperLink starts a
        ``flower-superexec`` that reaches it over TLS at ``127.0.0.1:<port>`` to launch
        each ServerApp, and without that name in the certificate no run ever starts (the
        superexec exits with "certificate is not valid for '127.0.0.1'", and ``flwr run``
        waits forever).
    days : int, optional
        Validity of both certificates, in days.

    Returns
    -------
    Certificates
        The paths written.

    Raises
    ------
    ValueError
        If ``hosts`` is empty or ``days`` is not positive.
    """
    if not hosts:
        raise ValueError("give at least one host name or IP address")
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    hosts = [*hosts, *(h for h in ("127.0.0.1", "localhost") if h not in hosts)]
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flower_app deployment CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_usages = ("digital_signature", "key_cert_sign", "crl_sign")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), start, end, ca=True, usages=ca_usages)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    usages = ("digital_signature", "key_agreement")
    cert = (
        _builder(subject, ca_name, key.public_key(), start, end, ca=False, usages=usages)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(hosts)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())
    )
    pem = serialization.Encoding.PEM
    return Certificates(
        ca_cert=_write(out / "ca.crt", ca_cert.public_bytes(pem)),
        ca_key=_write(out / "ca.key", _key_pem(ca_key), private=True),
        server_cert=_write(out / "server.pem", cert.public_bytes(pem)),
        server_key=_write(out / "server.key", _key_pem(key), private=True),
    )


def make_node_keys(
    out: Path, count: int, prefix: str = "supernode", start: int = 0
) -> list[NodeKey]:
    """Write ``count`` SuperNode authentication key pairs (EC P-384, OpenSSH format).

    Parameters
    ----------
    out : pathlib.Path
        Output folder (created); existing files are overwritten.
    count : int
        Number of key pairs.
    prefix : str, optional
        File name prefix: pair ``i`` is ``{prefix}-{i}`` (private key, mode 0600) and
        ``{prefix}-{i}.pub`` (public key), as ``ssh-keygen`` names them.
    start : int, optional
        Index of the first pair (to add keys for more nodes later).

    Returns
    -------
    list of NodeKey
        The pairs written, in index order.

    Raises
    ------
    ValueError
        If ``count`` is not positive.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    out.mkdir(parents=True, exist_ok=True)
    keys = []
    for i in range(start, start + count):
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        keys.append(
            NodeKey(
                private_key=_write(out / f"{prefix}-{i}", private, private=True),
                public_key=_write(out / f"{prefix}-{i}.pub", public + f" {prefix}-{i}\n".encode()),
            )
        )
    return keys


def make_identity_keys(
    out: Path, count: int, prefix: str = "identity", start: int = 0
) -> list[IdentityKey]:
    """Write ``count`` identity key pairs for secure aggregation (EC P-384, PEM).

    Parameters
    ----------
    out : pathlib.Path
        Output folder (created); existing files are overwritten.
    count : int
        Number of identities (one per SuperNode).
    prefix : str, optional
        File name prefix: identity ``i`` is ``{prefix}-{i}.key`` (private, mode 0600) and
        ``{prefix}-{i}.pub`` (public).
    start : int, optional
        Index of the first identity (to add nodes later).

    Returns
    -------
    list of IdentityKey
        The pairs written, in index order.

    Raises
    ------
    ValueError
        If ``count`` is not positive.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    out.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(start, start + count):
        key = ec.generate_private_key(ec.SECP384R1())
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pairs.append(
            IdentityKey(
                private_key=_write(out / f"{prefix}-{i}.key", _key_pem(key), private=True),
                public_key=_write(out / f"{prefix}-{i}.pub", public),
            )
        )
    return pairs


def read_public_keys(path: Path) -> list[bytes]:
    """Return the P-384 public keys (PEM) a file holds, in order.

    Raises
    ------
    ValueError
        If the file holds no PEM public key, or one that is not on P-384 (the curve
        Flower's signatures and the nodes' checks use).
    """
    text = Path(path).read_bytes()
    marker = b"-----BEGIN PUBLIC KEY-----"
    blocks = [marker + part for part in text.split(marker)[1:]]
    keys = []
    for block in blocks:
        try:
            key = serialization.load_pem_public_key(block.strip() + b"\n")
        except ValueError as err:
            raise ValueError(f"{path}: a block is not a PEM public key ({err})") from None
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
            raise ValueError(f"{path}: a key is not an EC P-384 public key")
        keys.append(
            key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    if not keys:
        raise ValueError(f"{path}: no PEM public key in it")
    return keys


def write_trusted_keys(out: Path, public_keys: list[Path]) -> Path:
    """Write the federation's trusted identities: every identity public key, concatenated.

    Every SuperNode gets this file (node_config ``secagg-trusted-keys``); a node then
    accepts a neighbour's secure-aggregation key only if one of these identities signed it.

    Parameters
    ----------
    out : pathlib.Path
        The file to write (its folder is created; an existing file is replaced).
    public_keys : list of pathlib.Path
        Identity public keys (PEM; a file may hold several), one per node of the federation.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        If a file holds no P-384 PEM public key, or two files hold the same key (an identity
        stands for one node).
    """
    keys: list[bytes] = []
    for path in public_keys:
        for key in read_public_keys(path):
            if key in keys:
                raise ValueError(f"{path}: the same identity is listed twice")
            keys.append(key)
    if not keys:
        raise ValueError("give at least one identity public key")
    out.parent.mkdir(parents=True, exist_ok=True)
    return _write(out, b"".join(keys))
