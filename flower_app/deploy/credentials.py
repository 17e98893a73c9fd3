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

__all__ = ["Certificates", "NodeKey", "make_certificates", "make_node_keys"]


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
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
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
