"""A file with its seal written last: ``write_sealed`` streams a payload to a new file and appends a checksum of it
(SHA-256, and an HMAC-SHA256 under ``FEDLIB_STORE_KEY`` when one is set) bound to an identity (what the file
belongs to, which code wrote it); ``read_sealed`` checks the seal before anything parses the payload. Snapshots
(``fedlib.runs.checkpoint``) are written this way.

The trust boundary: an unkeyed checksum proves the file is the one its writer wrote, bit for bit (a flipped bit, a
cut-short write, an edit with ``torch.save``), not who wrote it -- anyone who can write the file can also write a
matching checksum. A keyed seal proves it was written by someone holding the key: set the same
``FEDLIB_STORE_KEY`` for every process that writes or reads a shared store. Neither proves the numbers are right
(a run trained by buggy code seals fine): ``fedlib.experiments.verify`` trains a stored run again and is the last
word.

Layout: ``payload | seal (JSON) | len(seal) (8 bytes, big-endian) | TAIL``; the seal is
``{"identity": ..., "sha256": ..., "hmac": ... or null}``, each digest over the canonical JSON of the identity, a
newline, and the payload, so neither can be moved to another identity.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import stat
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

KEY_ENV = "FEDLIB_STORE_KEY"
KEY_MIN = 16  # characters: an HMAC key shorter than this is guessable
TAIL = b"\x00fedlib-seal-1\n"
SEAL_BYTES = 1 << 16  # a seal is ~500 bytes; a larger length field is damage, not a seal to read


class SealError(ValueError):
    """A sealed file whose seal is missing, malformed or does not match its contents (the message says which)."""


def store_key(value: str | bytes | None = None) -> bytes | None:
    """The HMAC key of the keyed seal: ``value``, else ``FEDLIB_STORE_KEY`` (unset or empty: None, no keyed seal);
    a key shorter than 16 characters is a ValueError naming it, since a short key can be guessed offline from any
    sealed file."""
    if value is None:
        value = os.environ.get(KEY_ENV, "")
        if not value:
            return None
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) < KEY_MIN:
        raise ValueError(
            f"{KEY_ENV} (the key of the snapshots' keyed seal) has {len(raw)} characters: give at least {KEY_MIN} "
            "(e.g. python -c 'import secrets; print(secrets.token_hex(16))'), or unset it for unkeyed checksums"
        )
    return raw


def _package_digest() -> str:
    """SHA-256 of every Python file of the fedlib package (names and bytes): the code that decides its numbers (its
    data files, the papers' published numbers and reference timings, decide none). Taken once, when this module is
    imported, so it describes the code this process runs rather than later edits."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


SOURCE = _package_digest()


def git_commit() -> str | None:
    """The git commit of the checkout fedlib runs from (None outside a git checkout): recorded with every run."""
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


@cache
def _commit() -> str | None:
    """The git commit when first asked (a run's first snapshot), not when a later one is written."""
    return git_commit()


def code_identity() -> dict:
    """Which code this process runs: fedlib's version, its git commit (None outside a checkout), the digest of its
    files (``source``: it also tells an edited, uncommitted checkout and an installed package apart) and the torch and
    numpy versions, whose kernels a resumed run's remaining rounds also depend on."""
    import numpy
    import torch

    import fedlib

    return {
        "fedlib": fedlib.__version__,
        "commit": _commit(),
        "source": SOURCE,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }


# what "other code" means for a snapshot: the files and library versions that decide the numbers; the commit alone
# is recorded, not compared (a commit that changes nothing in the package cannot change a result, and an edited
# checkout keeps its commit: ``source`` tells both)
DECIDING = ("fedlib", "source", "torch", "numpy")


def other_code(recorded: dict) -> list[str]:
    """The fields of ``code_identity()`` that decide a run's numbers and differ in ``recorded`` (empty: same code)."""
    now = code_identity()
    return [k for k in DECIDING if recorded.get(k) != now[k]]


def _canonical(identity: dict) -> bytes:
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class _SealingWriter:
    """The file object ``write_sealed`` hands its writer: hashes what passes and writes it on. The first failed
    write (a full disk) is kept and the rest dropped, so the writer finishes and the caller sees the OSError with its
    errno, not the writer's own report of it (torch's "unexpected pos")."""

    def __init__(self, f, identity: dict, key: bytes | None):
        head = _canonical(identity) + b"\n"
        self.f, self.error = f, None
        self.sha = hashlib.sha256(head)
        self.mac = hmac.new(key, head, hashlib.sha256) if key is not None else None

    def write(self, data) -> int:
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        if self.error is None:
            try:
                self.f.write(data)
                self.sha.update(data)
                if self.mac is not None:
                    self.mac.update(data)
            except OSError as e:
                self.error = e
        return n

    def flush(self) -> None:
        if self.error is None:
            try:
                self.f.flush()
            except OSError as e:
                self.error = e


def write_sealed(path: Path, identity: dict, write: Callable, key: bytes | None = None) -> None:
    """Create ``path`` (it must not exist: a link or file planted at a temporary name is not followed) and fill it
    with ``write(f)``'s output, then its seal: last, so a cut-short file has none. An OSError (ENOSPC on a full disk)
    is raised as the OS reported it; the caller removes the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        sink = _SealingWriter(f, identity, key)
        write(sink)
        sink.flush()
        if sink.error is not None:
            raise sink.error
        seal = {
            "identity": identity,
            "sha256": sink.sha.hexdigest(),
            "hmac": sink.mac.hexdigest() if sink.mac is not None else None,
        }
        text = json.dumps(seal, sort_keys=True).encode()
        f.write(text + len(text).to_bytes(8, "big") + TAIL)
        f.flush()
        os.fsync(f.fileno())  # on disk before it is renamed into place: a crash leaves the old snapshot or the new


def read_sealed(path: Path, key: bytes | None = None) -> tuple[dict, io.BytesIO]:
    """(identity, payload) of the sealed file ``path``, once its SHA-256 matches (and, with ``key``, its HMAC under
    that key: an unkeyed file, or one sealed under another key, is refused). A ``SealError`` says what is wrong;
    the payload is never handed on unchecked."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SealError("not a regular file")
        size = st.st_size
        if size < len(TAIL) + 8:
            raise SealError("no seal (cut short, or written by a fedlib before snapshots were sealed)")
        f.seek(size - len(TAIL) - 8)
        end = f.read()
        n = int.from_bytes(end[:8], "big")
        if end[8:] != TAIL or not 0 < n <= min(SEAL_BYTES, size - len(TAIL) - 8):
            raise SealError("no seal (cut short, or written by a fedlib before snapshots were sealed)")
        body = size - len(TAIL) - 8 - n
        f.seek(body)
        try:
            seal = json.loads(f.read(n))
            identity, sha, mac = seal["identity"], seal["sha256"], seal["hmac"]
        except (ValueError, TypeError, KeyError, RecursionError):
            raise SealError("its seal is malformed") from None
        if not isinstance(identity, dict) or not isinstance(sha, str) or not isinstance(mac, (str, type(None))):
            raise SealError("its seal is malformed")
        f.seek(0)
        payload = f.read(body)  # one bytes object: BytesIO shares it rather than copying a large snapshot
    head = _canonical(identity) + b"\n"
    digest = hashlib.sha256(head)
    digest.update(payload)  # not head + payload: that would copy a large snapshot
    if not hmac.compare_digest(digest.hexdigest(), sha):
        raise SealError("its checksum does not match its contents: changed after it was written")
    if key is not None:
        if mac is None:
            raise SealError(f"it has no keyed seal, and {KEY_ENV} is set: written without the key")
        keyed = hmac.new(key, head, hashlib.sha256)
        keyed.update(payload)
        if not hmac.compare_digest(keyed.hexdigest(), mac):
            raise SealError(f"its keyed seal does not match {KEY_ENV}: written by someone without this key")
    return identity, io.BytesIO(payload)
