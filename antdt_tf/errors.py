"""Errors of antdt-tf.

Every error the system raises on purpose derives from :class:`AntdtError`. Services map
the subclasses to gRPC status codes in one place (``sharding/service.py``); callers
classify failures by type, never by message text.
"""

# gRPC trailing-metadata key carrying the error's class name, so clients re-raise the
# same type (here, not in the service module: a client must not import the server side)
ERROR_METADATA_KEY = "antdt-error"

# An error message quotes at most this many characters of any value a caller sent
SHOWN_CHARS = 80
# and is never longer than this as a whole (gRPC carries it in a trailer: 16 KiB at most)
MAX_MESSAGE_CHARS = 2000


def shown(value) -> str:
    """``value`` (a caller's input) as an error message quotes it: ``repr``-quoted, so a
    newline or an empty string is visible, and cut to :data:`SHOWN_CHARS` characters with
    an ellipsis, so a huge input never makes the message huge."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > SHOWN_CHARS:
        return repr(text[:SHOWN_CHARS]) + f"\u2026 ({len(text)} chars)"
    return repr(text)


def bounded(message: str) -> str:
    """A whole error message cut to :data:`MAX_MESSAGE_CHARS` (a last guard; the values
    in it are cut by :func:`shown` already)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + "\u2026"


class AntdtError(Exception):
    """Root of all antdt-tf errors."""


class InvalidRequest(AntdtError, ValueError):
    """A request or spec is malformed or out of range (INVALID_ARGUMENT)."""


class UnknownDataset(AntdtError, KeyError):
    """The dataset was never registered (NOT_FOUND)."""

    def __str__(self):  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownTask(AntdtError, KeyError):
    """The task never talked to the master (NOT_FOUND)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class DatasetConflict(AntdtError):
    """A dataset name was re-registered with different parameters (ALREADY_EXISTS)."""


class StaleIncarnation(AntdtError):
    """A request came from a task incarnation that was replaced or declared dead
    (FAILED_PRECONDITION): a newer incarnation owns the task now."""


class LeaseNotHeld(AntdtError):
    """A report names a lease the reporter does not hold (FAILED_PRECONDITION): it was
    re-issued after a failure or expiry, or already settled. Nothing was counted."""


class IncompatibleState(AntdtError):
    """A state snapshot has an unknown format version or does not fit its dataset."""


class CorruptState(AntdtError):
    """A state file in ``--state_dir`` cannot be read back (bad magic, checksum or
    content). The master refuses to start rather than lose or repeat data."""


class DataError(AntdtError):
    """A data file is unreadable, truncated or not in the expected format."""


class StateDirLocked(AntdtError):
    """Another master process holds the state directory."""


class TaskAlreadyRunning(AntdtError):
    """StartTask for a task the agent is already running (FAILED_PRECONDITION): stop it
    first, or it would run twice."""


class StaleGeneration(AntdtError):
    """A start or stop names an older generation of a task than the one its host runs
    (FAILED_PRECONDITION): a newer launch owns the task; the request changed nothing."""


class Unschedulable(AntdtError):
    """No host can take the task under its placement (pinned to an unknown or lost
    host, or every host excluded)."""


class JobConflict(AntdtError):
    """A job was submitted to a master that runs another one (ALREADY_EXISTS)."""


class MasterUnavailable(AntdtError):
    """The master could not be reached within the call's deadline."""


class RpcFailed(AntdtError):
    """A service answered with an error that has no antdt-tf type (e.g. INTERNAL)."""
