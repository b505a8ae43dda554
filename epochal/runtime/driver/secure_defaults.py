"""Secure defaults where the runtime is configured (issue 51 §4): decided once per job
start, on the driver, before anything binds or writes.

* **Signed checkpoints on a cluster.** Whoever can write a cluster's checkpoint storage
  (a bucket, an NFS share) could otherwise plant a checkpoint the next restore unpickles
  in every executor. With no ``CheckpointConfig.signing_key``, a job on a cluster signs
  with a key generated once per user and host and kept beside the job, outside the
  storage: ``~/.epochal/signing.key`` (``$EPOCHAL_HOME/signing.key``; file 0600 in a 0700
  directory, both owner checked), so its restarts, resumes and savepoints of that user's
  jobs verify. ``CheckpointConfig(allow_unsigned=True)`` opts out by name. Local runs are
  unsigned unless given a key (their storage is the user's own disk).
* **No plaintext between hosts.** ``ChannelConfig.encryption=None`` turns TLS on whenever
  connections leave loopback — on a cluster, or when the driver binds a non-loopback
  address; ``encryption=False`` there is refused unless ``ChannelConfig(allow_plaintext=True)``
  (frames are authenticated only at connect: an on-path peer could inject pickles).

:func:`signing` and :func:`encryption` are pure decisions (tested as units); :func:`job_key`
reads or creates the key file (idempotent).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import stat

from epochal.backends.signing import key_bytes
from epochal.errors import ConfigError

log = logging.getLogger("epochal")

#: environment variable naming the directory of the generated signing key (default ``~/.epochal``)
HOME_ENV = "EPOCHAL_HOME"
KEY_FILE = "signing.key"

GIVEN, GENERATE, UNSIGNED = "given", "generate", "unsigned"


def signing(is_cluster: bool, signing_key: bytes | None, allow_unsigned: bool) -> str:
    """How the job's checkpoints are signed: :data:`GIVEN` (``checkpoint.signing_key``),
    :data:`GENERATE` (a cluster without a key: :func:`job_key`) or :data:`UNSIGNED` (a local
    run without a key, or a cluster with ``checkpoint.allow_unsigned=True``)."""
    if signing_key is not None:
        return GIVEN
    if is_cluster and not allow_unsigned:
        return GENERATE
    return UNSIGNED


def is_loopback(host: str | None) -> bool:
    """Whether binding ``host`` keeps connections on this machine (``localhost``, 127/8, ::1)."""
    if not host or host == "localhost":
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to whatever the network says
        return False


def encryption(is_cluster: bool, bind_host: str | None, encryption: bool | None, allow_plaintext: bool) -> bool:
    """Whether the job's connections are TLS-encrypted.

    Raises:
        ConfigError: ``encryption=False`` where connections leave loopback, without
            ``channels.allow_plaintext=True`` (naming both settings and the bind address).
    """
    between_hosts = is_cluster or not is_loopback(bind_host)
    if encryption is None:
        return between_hosts
    if not encryption and between_hosts and not allow_plaintext:
        where = "the job runs on a cluster" if is_cluster else f"the driver binds {bind_host}, not loopback"
        raise ConfigError(f"channels.encryption=False: {where}, so frames would cross the network in plaintext, "
                          "authenticated only at connect (an on-path peer could inject messages into a task); "
                          "leave channels.encryption at None (TLS), or set channels.allow_plaintext=True for a "
                          "network only you use")
    return encryption


def key_dir() -> str:
    return os.environ.get(HOME_ENV) or os.path.join(os.path.expanduser("~"), ".epochal")


def job_key(directory: str | None = None) -> tuple[bytes, str]:
    """``(key, path)``: the generated signing key in ``directory`` (default :func:`key_dir`),
    created on first use (64 random hex digits, ``O_EXCL`` 0600 in a 0700 directory); the key
    is that text, as ``CheckpointConfig(signing_key=text)`` and ``epochal savepoint create
    --signing-key-file`` take it.

    Raises:
        ConfigError: the directory or file is not this user's alone (owner, mode, symlink),
            or the file does not hold a key — naming it and ``checkpoint.signing_key``.
    """
    directory = directory or key_dir()
    path = os.path.join(directory, KEY_FILE)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    _private(directory, stat.S_ISDIR, "directory")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.warning("checkpoint.signing_key is not set on a cluster: generated a signing key at %s — checkpoints "
                    "and savepoints are signed with it; keep it (or pass checkpoint.signing_key; "
                    "checkpoint.allow_unsigned=True opts out)", path)
    _private(path, stat.S_ISREG, "file")
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().strip()
    try:  # the text is the key, as CheckpointConfig(signing_key=text) takes it (so it can be passed on)
        return key_bytes(text), path
    except ValueError:
        raise ConfigError(f"checkpoint.signing_key: the generated key file {path} does not hold a key (64 hex "
                          "digits); restore it from a backup, or pass checkpoint.signing_key") from None


def _private(path: str, kind, what: str) -> None:
    st = os.lstat(path)
    problem = ("is a symlink" if stat.S_ISLNK(st.st_mode) else f"is not a {what}" if not kind(st.st_mode)
               else f"is owned by uid {st.st_uid}, not this user" if st.st_uid != os.geteuid()
               else f"is open to group or others (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o077 else "")
    if problem:
        raise ConfigError(f"checkpoint.signing_key: the signing key {what} {path} {problem}: someone else could read "
                          f"or replace the key; fix it (chmod 700 / 600), set ${HOME_ENV}, or pass "
                          "checkpoint.signing_key")
