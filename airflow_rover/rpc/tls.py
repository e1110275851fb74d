"""The job's TLS on the wire (``core.job_tls``): making its certificate, and the gRPC channels,
gRPC ports and HTTP clients that use it. Without one (``tls`` None) everything is plaintext, as
the local backend's loopback needs."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from airflow_rover.core.job_tls import JobTLS

VALID_DAYS = 365  # a job's try outlives no certificate: every launch makes a new one


def make_certificate(hosts: Sequence[str], valid_days: int = VALID_DAYS) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``hosts`` (DNS names, a leading ``*.`` allowed, or IP
    addresses) and its key, both PEM: an EC P-256 key, valid for ``valid_days``. Not a CA:
    clients trust this very certificate (it signs nothing else)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # clocks of other nodes
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def grpc_channel(
    address: str, tls: JobTLS | None, options: Sequence[tuple[str, int]] = ()
) -> grpc.Channel:
    """A channel to ``address`` that trusts only the job's certificate (plaintext without)."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.cert())
    return grpc.secure_channel(address, credentials, options=list(options))


def add_port(server: grpc.Server, address: str, tls: JobTLS | None) -> int:
    """Serve on ``address`` with the job's certificate (plaintext without); returns the port."""
    if tls is None:
        return int(server.add_insecure_port(address))
    credentials = grpc.ssl_server_credentials([(tls.key(), tls.cert())])
    return int(server.add_secure_port(address, credentials))


def http_verify(tls: JobTLS | None) -> ssl.SSLContext | bool:
    """What an HTTP client of the master verifies: the job's certificate only, or (without one)
    the default, which a plaintext ``http://`` address never uses."""
    if tls is None:
        return True
    return ssl.create_default_context(cadata=tls.cert().decode())


def http_scheme(tls: JobTLS | None) -> str:
    return "http" if tls is None else "https"
