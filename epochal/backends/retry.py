"""Retrying storage calls through transient faults: throttling, a flaky network, a
storage service that is down for a while.

Every call :class:`~epochal.backends.storage.CheckpointStorage` makes on its file system
(write, rename, read, list, delete, existence checks) goes through :func:`call`: a
*transient* error (:func:`is_transient`) is retried with exponential backoff and full
jitter (the "exponential backoff and jitter" of AWS's architecture blog, what its SDKs do)
until the call succeeds or the policy's ``deadline`` passed since the first attempt; a
*permanent* error (the file is missing, access is denied, the disk is full) is raised at
once — retrying cannot help, and the caller should decide now (decline the checkpoint,
fail the restore).

The S3 clients retry a little themselves (botocore a few attempts, s3fs ``SlowDown``
five times within about two seconds); this layer outlasts them: an outage of 30 s or
minutes of throttling is a wait, not a failed checkpoint, as long as the deadline allows.
Pure apart from ``sleep`` and ``clock``, which tests replace.
"""
from __future__ import annotations

import errno
import logging
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RetryPolicy", "call", "is_transient"]

log = logging.getLogger("epochal.storage")

#: errno values of a fault that may pass: busy or throttled (s3fs maps SlowDown and 503 to
#: EBUSY, 500 InternalError to EREMOTEIO), timeouts and broken connections, I/O errors of
#: network file systems
_TRANSIENT_ERRNO = frozenset(getattr(errno, n) for n in (
    "EBUSY", "EAGAIN", "EIO", "EREMOTEIO", "ETIMEDOUT", "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "EPIPE",
    "EHOSTUNREACH", "EHOSTDOWN", "ENETUNREACH", "ENETDOWN", "ENETRESET", "ESTALE", "EINTR") if hasattr(errno, n))
#: errno values retrying cannot fix: a full disk or quota, a read-only or refused path, a bad request
_PERMANENT_ERRNO = frozenset(getattr(errno, n) for n in (
    "ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EINVAL", "ENAMETOOLONG", "EMSGSIZE", "ENOSYS", "EISDIR",
    "ENOTDIR", "ENOENT", "EEXIST", "EFBIG", "ENOTEMPTY") if hasattr(errno, n))
_PERMANENT_TYPES = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)
#: S3 error codes of throttling and server-side trouble (botocore's ClientError)
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                              "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequests", "500", "502", "503",
                              "504", "429"})
#: words in the class names of the HTTP stacks' connection and timeout errors (botocore,
#: urllib3, aiohttp) that are not OSErrors
_TRANSIENT_NAMES = ("Connection", "Timeout", "Throttl", "ServerDisconnected", "IncompleteRead", "ResponseStream")


@dataclass(frozen=True)
class RetryPolicy:
    """How long a storage call keeps retrying transient errors.

    Attributes:
        deadline: seconds from the first attempt after which the last error is raised
            (0: never retry).
        initial: the first backoff; each further one doubles (``multiplier``) up to
            ``maximum``; every wait is drawn uniformly from [0, backoff] (full jitter),
            so many tasks retrying at once do not hit the storage in lockstep.
    """

    deadline: float = 30.0
    initial: float = 0.05
    maximum: float = 2.0
    multiplier: float = 2.0

    def backoff(self, attempt: int) -> float:
        """The upper bound of the wait after failed attempt ``attempt`` (1-based)."""
        return min(self.maximum, self.initial * self.multiplier ** (attempt - 1))


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _classify(exc: BaseException) -> bool | None:
    """True (transient), False (permanent) or None (this exception does not say)."""
    if isinstance(exc, _PERMANENT_TYPES):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError, socket.timeout)):
        return True
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in _PERMANENT_ERRNO:
            return False
        if exc.errno in _TRANSIENT_ERRNO:
            return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _TRANSIENT_CODES or (isinstance(status, int) and (status >= 500 or status == 429)):
            return True
        return False
    if any(word in type(exc).__name__ for word in _TRANSIENT_NAMES):
        return True
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the call that raised ``exc`` may succeed. The first exception in
    ``exc``'s cause / context chain that says decides: a permanent one (missing file,
    denied access, full disk, a bad request) wins over the transient cause it may wrap.
    Programming errors and anything unknown are permanent."""
    for e in _chain(exc):
        verdict = _classify(e)
        if verdict is not None:
            return verdict
    return False


def call(fn: Callable, policy: RetryPolicy, what: str, *, should_stop: Callable[[], bool] | None = None,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
         rng: random.Random | None = None):
    """``fn()``, retried through transient errors under ``policy``.

    ``what`` names the call for the log ("write s3://b/job/chk-0000000007/_metadata"): the
    first retry of a call and its outcome are logged at WARNING on ``epochal.storage``.
    ``should_stop()`` is checked before every retry: True gives up at once (the caller's
    attempt is over).

    Raises:
        the last error of ``fn`` — at once when it is permanent, else once the deadline
        passed; its ``retried`` attribute (when settable) holds the number of retries.
    """
    start = clock()
    attempt = 0
    rng = rng or random
    while True:
        attempt += 1
        try:
            result = fn()
        except Exception as exc:
            transient = is_transient(exc)
            elapsed = clock() - start
            wait = rng.uniform(0, policy.backoff(attempt))
            if not transient or elapsed + wait > policy.deadline or (should_stop is not None and should_stop()):
                if attempt > 1:
                    log.warning("storage: %s failed after %d attempts in %.1f s: %s: %s", what, attempt, elapsed,
                                type(exc).__name__, exc)
                try:
                    exc.retried = attempt - 1
                except Exception:
                    pass
                raise
            if attempt == 1:
                log.warning("storage: %s failed (%s: %s); retrying for up to %.0f s", what, type(exc).__name__,
                            str(exc)[:200], policy.deadline)
            sleep(wait)
            continue
        if attempt > 1:
            log.warning("storage: %s succeeded after %d attempts in %.1f s", what, attempt, clock() - start)
        return result
