"""TLS certificates and SuperNode authentication keys for a Flower deployment (``fedseg flower certs``).

Writes to ``OUT``::

    ca.crt, ca.key                 a self-signed certificate authority (keep ca.key offline)
    superlink.crt, superlink.key   the SuperLink's TLS certificate, signed by the CA; subject
                                   alternative names 127.0.0.1, localhost and every --host
    site-keys/<site>.key           a SuperNode's authentication key (EC P-384, OpenSSH format): give it to that
                                   hospital only, then delete it here (its holder can act as that site)
    supernodes/<site>.pub          its public key: the coordinator registers it with the SuperLink
                                   (``--auth-keys certs/supernodes``: public keys only)

The SuperLink uses ``ca.crt`` + ``superlink.crt`` + ``superlink.key`` (``--ssl-ca-certfile``,
``--ssl-certfile``, ``--ssl-keyfile``); every SuperNode gets ``ca.crt`` (``--root-certificates``)
to check it talks to the real SuperLink, and its own ``<site>.key``
(``--auth-supernode-private-key``). With ``--enable-supernode-auth`` the SuperLink accepts only
SuperNodes whose public key was registered (``flwr supernode register`` / ``fedseg flower server
--auth-keys``). Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedseg.atomic_files import naming_errors

CURVE = ec.SECP384R1()
DAYS = 825  # at most what common TLS clients accept for a leaf certificate


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_folder(cls, folder: Path) -> TlsFiles:
        """The three files in ``folder``, as absolute paths (Flower refuses relative ones)."""
        folder = Path(folder).resolve()
        files = cls(folder / "ca.crt", folder / "superlink.crt", folder / "superlink.key")
        missing = [str(p) for p in (files.ca, files.cert, files.key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"missing {', '.join(missing)} (create them with `fedseg flower certs --out {folder}`)"
            )
        return files


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    with naming_errors(path):
        path.write_bytes(data)


def _name(common: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedseg"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")  # '_': container names (Docker's DNS resolves them)


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot name the SuperLink in its certificate (``--host``): not an IP address and not a host name
    (letters, digits, '-' and '_' in dot-separated labels of at most 63, 253 in all; a leading ``*.`` wildcard
    allowed); None when it can."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    name = host[2:] if host.startswith("*.") else host
    labels = name.rstrip(".").split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "not an IP address or a host name (letters, digits, '-' and '_' in dot-separated labels)"
    return None


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["127.0.0.1", "localhost", *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(out: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(CURVE)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedseg federation CA"))
        .issuer_name(_name("fedseg federation CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    _write_private(
        out / "ca.key",
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    with naming_errors(out / "ca.crt"):
        (out / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def make_server_cert(out: Path, ca_key, ca_cert: x509.Certificate, hosts: list[str]) -> None:
    key = ec.generate_private_key(CURVE)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedseg SuperLink"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=DAYS))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write_private(
        out / "superlink.key",
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    with naming_errors(out / "superlink.crt"):
        (out / "superlink.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


SITE_KEYS, PUBLIC_KEYS = "site-keys", "supernodes"  # the folders of the sites' private and public keys


def make_node_key(out: Path, name: str) -> tuple[Path, Path]:
    """``out/site-keys/<name>.key`` (OpenSSH private key, EC P-384; the folder 0700) and
    ``out/supernodes/<name>.pub`` (OpenSSH public key): apart, so the folder the coordinator registers
    (``--auth-keys``) holds no key that can act as a site."""
    key = ec.generate_private_key(CURVE)
    (out / SITE_KEYS).mkdir(mode=0o700, parents=True, exist_ok=True)
    (out / PUBLIC_KEYS).mkdir(parents=True, exist_ok=True)
    private, public = out / SITE_KEYS / f"{name}.key", out / PUBLIC_KEYS / f"{name}.pub"
    _write_private(
        private,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    with naming_errors(public):
        public.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            + f" fedseg-{name}\n".encode()
        )
    return private, public


def make_certs(out: Path, hosts: Sequence[str] = (), nodes: Sequence[str] = ()) -> TlsFiles:
    """CA + SuperLink certificate (+ one authentication key pair per name in ``nodes``) in ``out``.

    Written into a hidden staging folder inside ``out`` first (``fedseg.data.folder_write.staging_folder``, mode 0700)
    and moved into place at the end (``fedseg.data.folder_write.move_in``: the entries it replaces are moved aside first
    and put back if a move fails), so a failure or an interrupt (a full disk, a forbidden folder, Ctrl-C) leaves
    ``out`` as it was: never a new CA beside an old SuperLink certificate. Keys of other sites already in
    ``out/site-keys/`` and ``out/supernodes/`` are kept."""
    from fedseg.data.folder_write import move_in, staging_folder

    out = Path(out)
    with staging_folder(out, "certs") as tmp:
        ca_key, ca_cert = make_ca(tmp)
        make_server_cert(tmp, ca_key, ca_cert, list(hosts))
        for name in nodes:
            make_node_key(tmp, name)
        for folder in (SITE_KEYS, PUBLIC_KEYS) if nodes else ():  # replaced as a whole: the other sites' keys too
            for key in (out / folder).iterdir() if (out / folder).is_dir() else ():
                kept = tmp / (SITE_KEYS if key.suffix == ".key" else PUBLIC_KEYS) / key.name  # an older layout's
                if not kept.exists():  # private keys in supernodes/ move to site-keys/
                    shutil.copy2(key, kept)
        move_in(tmp, out, [out / entry.name for entry in tmp.iterdir() if (out / entry.name).exists()])
    return TlsFiles.in_folder(out)


def private_keys_in(folder: Path) -> list[str]:
    """The names of the private keys (``*.key``) in ``folder``, the coordinator's ``--auth-keys``: each belongs to
    its hospital only (whoever holds it can connect as that site)."""
    return sorted(p.name for p in folder.glob("*.key")) if folder.is_dir() else []
