"""Retrying storage calls (epochal.backends.retry), the pure part: which errors are
transient, the backoff schedule, the deadline — on a fake clock."""
from __future__ import annotations

import errno
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.backends import retry
from epochal.backends.retry import RetryPolicy, is_transient


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def client_error(code, status):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


@pytest.mark.parametrize("exc, transient", [
    (OSError(errno.EBUSY, "SlowDown (s3fs)"), True),
    (OSError(errno.EREMOTEIO, "InternalError (s3fs)"), True),
    (TimeoutError("read timed out"), True),
    (ConnectionResetError("reset"), True),
    (OSError(errno.ENOSPC, "No space left on device"), False),
    (OSError(errno.EDQUOT, "quota"), False),
    (FileNotFoundError("gone"), False),
    (PermissionError("denied"), False),
    (ValueError("a bug"), False),
    (KeyError("a bug"), False),
])
def test_transient_errors_are_told_from_permanent_ones(exc, transient):
    assert is_transient(exc) is transient


def test_s3_client_errors_and_wrapped_causes():
    assert is_transient(client_error("SlowDown", 503))
    assert is_transient(client_error("InternalError", 500))
    assert not is_transient(client_error("AccessDenied", 403))
    assert not is_transient(client_error("NoSuchBucket", 404))
    wrapped = OSError("write failed")  # no errno: the cause decides
    wrapped.__cause__ = client_error("SlowDown", 503)
    assert is_transient(wrapped)
    denied = PermissionError("denied")  # a permanent error wins over a transient cause
    denied.__cause__ = TimeoutError()
    assert not is_transient(denied)
    from botocore.exceptions import EndpointConnectionError

    assert is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))


def test_a_transient_fault_is_retried_until_it_passes():
    clock, calls = Clock(), []

    def flaky():
        calls.append(clock.now)
        if len(calls) < 6:
            raise OSError(errno.EBUSY, "SlowDown")
        return "ok"

    policy = RetryPolicy(deadline=30, initial=0.05, maximum=2.0)
    assert retry.call(flaky, policy, "write x", sleep=clock.sleep, clock=lambda: clock.now,
                      rng=random.Random(1)) == "ok"
    assert len(calls) == 6
    assert all(0 <= s <= policy.backoff(i + 1) for i, s in enumerate(clock.sleeps))


def test_a_permanent_fault_is_raised_at_once():
    clock, calls = Clock(), []

    def full():
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space") as info:
        retry.call(full, RetryPolicy(), "write x", sleep=clock.sleep, clock=lambda: clock.now)
    assert calls == [1] and clock.sleeps == [] and info.value.retried == 0


@settings(max_examples=100, deadline=None)
@given(deadline=st.floats(min_value=0, max_value=120), seed=st.integers(0, 1000))
def test_an_outage_longer_than_the_deadline_gives_up_within_it(deadline, seed):
    clock = Clock()

    def down():
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(ConnectionRefusedError) as info:
        retry.call(down, RetryPolicy(deadline=deadline), "list x", sleep=clock.sleep, clock=lambda: clock.now,
                   rng=random.Random(seed))
    assert clock.now <= deadline  # never sleeps past the deadline
    assert info.value.retried == len(clock.sleeps)


def test_should_stop_ends_the_retries():
    clock, stop = Clock(), []

    def down():
        stop.append(1)
        raise TimeoutError("timed out")

    with pytest.raises(TimeoutError):
        retry.call(down, RetryPolicy(deadline=60), "read x", should_stop=lambda: len(stop) >= 3,
                   sleep=clock.sleep, clock=lambda: clock.now)
    assert len(stop) == 3
