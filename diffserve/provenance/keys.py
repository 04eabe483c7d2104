"""The Ed25519 signing key: a PEM file, created on first use when it is the default
one, and the ``Signer`` that signs manifests with it.

Two processes that start at once (the server's workers, a CLI beside a server) must end
up with one key: a new key is written whole to a private temporary file and hard-linked
into place; the loser of the race finds the file there and reads the winner's key.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.provenance import manifest as m
from diffserve.provenance.facts import Generation

logger = get_logger(__name__)

DEFAULT_KEY_NAME = "provenance-ed25519.pem"


class Signer:
    """Signs manifests with one private key (Ed25519 is deterministic: the same
    manifest always gets the same signature)."""

    def __init__(self, private_key: Any) -> None:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw
        )

    @property
    def public_key_b64(self) -> str:
        return base64.b64encode(self.public_key).decode("ascii")

    def sign(self, manifest: dict[str, Any]) -> str:
        """The signed manifest's text."""
        value = self._key.sign(m.signed_bytes(manifest))
        return m.attach_signature(manifest, self.public_key, value)


@dataclass(frozen=True)
class Signing:
    """What signs a request's outputs: the key, the facts they share (each output's
    own seed replaces ``generation.seed``) and the diffserve version that made them."""

    signer: Signer
    generation: Generation
    version: str

    def for_seed(self, seed: int) -> Signing:
        return dataclasses.replace(
            self, generation=dataclasses.replace(self.generation, seed=int(seed))
        )


def generate_pem() -> bytes:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    return Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )


def load_signer(path: str | os.PathLike[str], *, create: bool) -> Signer:
    """The key in ``path``; ``create``: make it (mode 0600) when it does not exist."""
    target = Path(path)
    if create and not target.exists():
        _create(target)
    try:
        data = target.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the provenance key {target}: {exc.strerror or exc}",
            path="server.provenance.key_file",
            hint="give an Ed25519 private key in PEM (openssl genpkey -algorithm "
            "ed25519), or leave key_file empty for one made in state_dir",
        ) from None
    return Signer(private_key_from_pem(data, str(target)))


def private_key_from_pem(data: bytes, where: str) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{where} is not an unencrypted PEM private key ({exc})",
            path="server.provenance.key_file",
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"{where} holds a {type(key).__name__}, not an Ed25519 key",
            path="server.provenance.key_file",
            hint="openssl genpkey -algorithm ed25519 -out key.pem",
        )
    return key


def _create(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Unique per attempt (threads of one process race too).
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(generate_pem())
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, target)
            logger.info("created the provenance signing key %s", target)
        except FileExistsError:  # another process made it first: theirs is the key
            pass
    finally:
        temporary.unlink(missing_ok=True)
