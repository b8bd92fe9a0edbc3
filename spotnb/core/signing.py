"""Authenticating what spotnb unpickles or executes: HMAC-SHA256 with a per-job key.

Why: the store is shared and often writable by more principals than the notebook machine (a
bucket policy, a team share). Pickles run code when loaded, so every pickle spotnb loads
(the function, its result, a checkpoint's state) and every document that steers where files
go or what runs (the job spec, a checkpoint MANIFEST) carries an HMAC made with a key that
never enters the store. Who can write the store can then delete or corrupt work, which is
detected, but can run no code.

The key is made at submit and kept on the notebook machine in `$SPOTNB_HOME/keys/<job>.key`
(0600); the controller hands it to each instance at launch (environment of the local agent,
the boot script on a cloud VM), where the agent reads it from `SPOTNB_JOB_KEY` and removes it
from its environment before the user's function runs.

Every MAC covers the job id and the object's name in the job as well as its bytes, so a
signed object cannot be replayed as another (a checkpoint's state as the function, one job's
result as another's).

Shared by the notebook side and the runtime: imports neither.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

__all__ = [
    "BadSignature",
    "KEY_ENV",
    "new_key",
    "seal",
    "unseal",
    "sign_doc",
    "verify_doc",
    "canonical",
    "key_from_env",
    "save_key",
    "load_key",
    "key_path",
]

KEY_ENV = "SPOTNB_JOB_KEY"
_MAGIC = b"SPOTNB-HMAC-SHA256 v1 "  # a sealed blob: magic, hex MAC, newline, payload
_MAC_HEX = 64


class BadSignature(ValueError):
    """A sealed object or signed document whose MAC is missing or wrong: never used.

    A ValueError, so checkpoint restore treats it like a corrupt checkpoint and falls back."""


def new_key() -> bytes:
    """32 random bytes: the per-job key."""
    return secrets.token_bytes(32)


def _mac(key: bytes, job_id: str, name: str, data: bytes) -> str:
    msg = b"spotnb\0" + job_id.encode() + b"\0" + name.encode() + b"\0" + data
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def seal(key: bytes, job_id: str, name: str, payload: bytes) -> bytes:
    """`payload` with its MAC in front, as one object: one atomic write, no window in which
    a reader could see new bytes with an old signature."""
    return _MAGIC + _mac(key, job_id, name, payload).encode() + b"\n" + payload


def unseal(key: bytes | None, job_id: str, name: str, blob: bytes) -> bytes:
    """The payload of a sealed blob, or BadSignature (unsigned, tampered, or another object's)."""
    if key is None:
        raise BadSignature(f"{name}: no key to verify it with")
    head = len(_MAGIC) + _MAC_HEX + 1
    if not blob.startswith(_MAGIC) or len(blob) < head or blob[head - 1 : head] != b"\n":
        raise BadSignature(
            f"{name} of job {job_id} is not signed by spotnb (written by something "
            "else, or by a spotnb older than the signing of jobs)"
        )
    mac, payload = blob[len(_MAGIC) : head - 1].decode("ascii", "replace"), blob[head:]
    if not hmac.compare_digest(mac, _mac(key, job_id, name, payload)):
        raise BadSignature(
            f"{name} of job {job_id} has a wrong signature: it was modified in the "
            "store, or belongs to another object or job"
        )
    return payload


def canonical(doc: dict[str, Any]) -> bytes:
    """The bytes a document's MAC covers (key order and spacing do not matter)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sign_doc(key: bytes, job_id: str, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with a `signature` field over all its other fields."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    return {**body, "signature": _mac(key, job_id, name, canonical(body))}


def verify_doc(key: bytes | None, job_id: str, name: str, doc: Any) -> dict[str, Any]:
    """`doc` without its signature, or BadSignature."""
    if not isinstance(doc, dict) or not isinstance(doc.get("signature"), str):
        raise BadSignature(f"{name} of job {job_id} is not signed")
    if key is None:
        raise BadSignature(f"{name}: no key to verify it with")
    body = {k: v for k, v in doc.items() if k != "signature"}
    if not hmac.compare_digest(doc["signature"], _mac(key, job_id, name, canonical(body))):
        raise BadSignature(f"{name} of job {job_id} has a wrong signature: it was modified in the store")
    return body


def key_from_env(environ: Any = None) -> bytes | None:
    """The instance's key, removed from the environment so the user's function and anything
    it starts never inherit it."""
    env = os.environ if environ is None else environ
    if environ is None:
        _scrub_initial_environ(KEY_ENV)
    text = env.pop(KEY_ENV, None)
    if not text:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def _scrub_initial_environ(name: str) -> None:
    """Overwrite `name`'s value where the process's environment began: removing it from
    `os.environ` does not change `/proc/<pid>/environ`, which shows that first copy to every
    process of the same user (the job's script, a child of the agent, included)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        libc.getenv.argtypes = [ctypes.c_char_p]
        address = libc.getenv(name.encode())
        if address:
            size = len(ctypes.string_at(address))
            ctypes.memset(address, ord("-"), size)
    except Exception:  # noqa: BLE001 - no libc (not Linux): nothing more can be done here
        pass


# -- notebook side: the key file --------------------------------------------------------------
def _home() -> Path:
    from spotnb.core.home import spotnb_home

    return spotnb_home()


def key_path(job_id: str) -> Path:
    return _home() / "keys" / f"{job_id}.key"


def save_key(job_id: str, key: bytes) -> Path:
    """Write the key owner-only (the folder 0700, the file 0600, never world-readable, even
    for an instant)."""
    path = key_path(job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return path


def load_key(job_id: str) -> bytes | None:
    """The job's key on this machine, or None (a job submitted elsewhere, or before keys)."""
    try:
        return bytes.fromhex(key_path(job_id).read_text().strip())
    except (OSError, ValueError):
        return None
