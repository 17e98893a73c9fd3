"""Certificates and node keys of ``python -m flower_app.deploy`` in the formats Flower reads."""

from __future__ import annotations

import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key

from flower_app.deploy import connection_toml, make_certificates, make_node_keys
from flower_app.deploy.__main__ import main


def test_server_certificate_is_signed_by_the_ca_for_every_host(tmp_path) -> None:
    certs = make_certificates(tmp_path, ["superlink.example.org", "192.0.2.10"])
    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(certs.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["superlink.example.org", "localhost"]
    # 127.0.0.1 always: flwr 1.42's SuperLink reaches itself there (its superexec)
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("192.0.2.10"),
        ipaddress.ip_address("127.0.0.1"),
    ]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in (certs.ca_key, certs.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_node_keys_load_with_flowers_own_loaders(tmp_path) -> None:
    keys = make_node_keys(tmp_path, 2)
    assert [k.private_key.name for k in keys] == ["supernode-0", "supernode-1"]
    for key in keys:
        private = load_ssh_private_key(key.private_key.read_bytes(), None)  # flower-supernode
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.curve.name == "secp384r1"
        assert try_load_public_key(key.public_key)  # flwr supernode register
    assert keys[0].public_key.read_bytes() != keys[1].public_key.read_bytes()


def test_command_line_and_connection_entry(tmp_path, capsys) -> None:
    assert main(["certs", "--out", str(tmp_path / "c"), "--host", "127.0.0.1"]) == 0
    assert main(["node-keys", "--out", str(tmp_path / "k"), "--count", "3"]) == 0
    assert sorted(p.name for p in (tmp_path / "k").iterdir())[-2:] == [
        "supernode-2",
        "supernode-2.pub",
    ]
    assert main(["node-keys", "--out", str(tmp_path / "k"), "--count", "0"]) == 2
    toml = connection_toml("edge", "127.0.0.1:9092", tmp_path / "c" / "ca.crt")
    assert toml.startswith('[superlink.edge]\naddress = "127.0.0.1:9092"\nroot-certificates')
    with pytest.raises(ValueError, match="host"):
        make_certificates(tmp_path, [])


def test_identities_and_trusted_list_are_what_secure_aggregation_nodes_read(tmp_path) -> None:
    """The identity keys load with the loaders the nodes' secure-aggregation code uses
    (Flower's PEM helpers), sign what a node endorses, and the trusted list holds each
    identity once; a duplicate or a key that is not P-384 is refused."""
    from flwr.supercore.primitives.asymmetric import (
        bytes_to_private_key,
        bytes_to_public_key,
        public_key_to_bytes,
        sign_message,
        verify_signature,
    )

    from flower_app.deploy import make_identity_keys, write_trusted_keys
    from flower_app.deploy.credentials import read_public_keys

    ids = make_identity_keys(tmp_path / "ids", 3, prefix="edge")
    assert [k.private_key.name for k in ids] == ["edge-0.key", "edge-1.key", "edge-2.key"]
    trusted = write_trusted_keys(tmp_path / "federation.pem", [k.public_key for k in ids])
    listed = read_public_keys(trusted)
    assert len(set(listed)) == 3
    for key in ids:
        assert stat.S_IMODE(key.private_key.stat().st_mode) == 0o600
        private = bytes_to_private_key(key.private_key.read_bytes())
        assert private.curve.name == "secp384r1"
        mine = public_key_to_bytes(private.public_key())
        assert mine in listed and mine == key.public_key.read_bytes()
        signature = sign_message(private, b"run key")
        assert verify_signature(bytes_to_public_key(mine), b"run key", signature)
    with pytest.raises(ValueError, match="twice"):
        write_trusted_keys(tmp_path / "dup.pem", [ids[0].public_key, ids[0].public_key])
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    (tmp_path / "p256.pub").write_bytes(public_key_to_bytes(other))
    with pytest.raises(ValueError, match="P-384"):
        write_trusted_keys(tmp_path / "bad.pem", [tmp_path / "p256.pub"])
    # the command line: one identity on a device, the list assembled from the public keys
    assert main(["identity-keys", "--out", str(tmp_path / "c"), "--count", "1",
                 "--prefix", "edge-01"]) == 0  # fmt: skip
    assert main(["trusted-keys", "--out", str(tmp_path / "c" / "federation.pem"),
                 str(tmp_path / "c" / "edge-01-0.pub"), str(ids[1].public_key)]) == 0  # fmt: skip
    assert len(read_public_keys(tmp_path / "c" / "federation.pem")) == 2
    assert main(["trusted-keys", "--out", str(tmp_path / "x.pem"), str(trusted),
                 str(ids[2].public_key)]) == 2  # ids[2] is in federation.pem already  # fmt: skip
