"""TLS echo server and client with a certificate made at start.

    python examples/tls_echo.py             # needs cryptography (pip install cryptography)

A self-signed certificate for localhost / 127.0.0.1 is made with the
`cryptography` package and written to a temporary directory. The server
uses it; the client trusts it and checks the host name, as a real client
would. The TLS layer is the standard `ssl` module's: zuvrs takes the same
`ssl=` and `server_hostname=` arguments as asyncio.
"""

import asyncio
import datetime
import ipaddress
import ssl
import tempfile
from pathlib import Path

import zuvrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """Write a self-signed certificate for localhost and its key; return their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def main(cert_path: Path, key_path: Path) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert_path, key_path)
    client_context = ssl.create_default_context(cafile=cert_path)  # trusts our certificate, checks the host name

    served = asyncio.Event()

    async def handle_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()
            await writer.wait_closed()
        finally:
            served.set()

    server = await asyncio.start_server(handle_client, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname="localhost"
        )
        tls = writer.get_extra_info("ssl_object")
        print(f"connected with {tls.version()}, cipher {tls.cipher()[0]}")
        print("server certificate for", tls.getpeercert()["subject"][0][0][1])

        message = b"secret " * 10_000
        writer.write(message)
        await writer.drain()
        echoed = await reader.readexactly(len(message))
        print(f"sent and got back {len(echoed):,} bytes, equal: {echoed == message}")
        writer.close()
        await writer.wait_closed()
        await served.wait()
    print("server closed")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        zuvrs.run(main(*make_certificate(Path(tmp))))
