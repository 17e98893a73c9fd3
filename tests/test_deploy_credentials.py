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
