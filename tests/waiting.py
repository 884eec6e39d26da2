"""The one way tests wait for something: poll a predicate until it holds.

Tests trigger on progress, not on time: they wait *for* a state (a task serves, a lease
expired, records were trained), never a fixed number of seconds, so a slow machine
makes them slower, not wrong. The timeout only bounds a hang, and its message names what
did not happen."""

from __future__ import annotations

import time
from typing import Callable, TypeVar, Union

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What a test waited for did not happen in time (an ``AssertionError``: a failed
    test, not an error in it)."""


def wait_for(predicate: Callable[[], T], timeout: float, what: Union[str, Callable[[], str]],
             interval: float = 0.05) -> T:
    """Polls ``predicate()`` every ``interval`` seconds until it returns a true value,
    and returns that value. After ``timeout`` seconds raises :class:`WaitTimeout`
    naming ``what`` (a string, or a callable giving one at the timeout: e.g. with a log
    tail). The last poll is at or after the deadline, so a condition that came true
    while the machine was busy still counts; exceptions the predicate raises
    propagate."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = what() if callable(what) else what
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {text}")
        time.sleep(interval)
