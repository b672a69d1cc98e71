"""Throw-away certificates for TLS tests, made with the ``cryptography`` package.

``make_pki(directory)`` writes a small PKI and returns a ``Pki`` of paths:

- ``ca``: a root CA ("zuvrs test CA") and ``other_ca``: an unrelated one;
- ``server``: "localhost" (DNS localhost, IP 127.0.0.1) signed by ``ca``;
- ``alt_server``: "alt.example" signed by ``ca`` (what an SNI callback switches to);
- ``client``: a client certificate ("zuvrs client") signed by ``ca``;
- ``expired``: "localhost", signed by ``ca``, expired yesterday;
- ``wrong_host``: "wrong.example" only, signed by ``ca``;
- ``unknown_ca``: "localhost" signed by ``other_ca``.

Each certificate entry is a ``(cert_path, key_path)`` pair. EC P-256 keys
keep generation fast.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    other_ca: Path
    server: tuple
    alt_server: tuple
    client: tuple
    expired: tuple
    wrong_host: tuple
    unknown_ca: tuple


def make_pki(directory) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key, path):
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def make_ca(cn, stem):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - day)
            .not_valid_after(now + 30 * day)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        path = d / f"{stem}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert, key, path

    def make_leaf(stem, cn, issuer, *, dns=(), ips=(), client=False, expired=False):
        ca_cert, ca_key, _ = issuer
        key = ec.generate_private_key(ec.SECP256R1())
        begin, end = (now - 30 * day, now - day) if expired else (now - day, now + 30 * day)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(begin)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        names = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path, key_path = d / f"{stem}.pem", d / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(key, key_path)
        return cert_path, key_path

    ca = make_ca("zuvrs test CA", "ca")
    other = make_ca("zuvrs other CA", "other_ca")
    return Pki(
        ca=ca[2],
        other_ca=other[2],
        server=make_leaf("server", "localhost", ca, dns=["localhost"], ips=["127.0.0.1"]),
        alt_server=make_leaf("alt_server", "alt.example", ca, dns=["alt.example"]),
        client=make_leaf("client", "zuvrs client", ca, client=True),
        expired=make_leaf("expired", "localhost", ca, dns=["localhost"], expired=True),
        wrong_host=make_leaf("wrong_host", "wrong.example", ca, dns=["wrong.example"]),
        unknown_ca=make_leaf("unknown_ca", "localhost", other, dns=["localhost"]),
    )
