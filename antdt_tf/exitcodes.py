"""The exit codes of every antdt-tf binary, in one place (docs/cli-exit-codes.md).

| code | meaning                                                                  |
|------|--------------------------------------------------------------------------|
| 0    | done                                                                     |
| 1    | the job (or task) failed; also an unexpected internal error              |
| 2    | bad input: a flag, an argument or an input file (data) is wrong — fix it |
| 3    | the state directory is damaged, incompatible or in use (left untouched)  |
| 4    | cannot serve: the port is in use or the address is not on this host      |
| 75   | a cluster task is unavailable: relaunch once it is back (chief binaries) |

Bad input is answered with one line on stderr, ``<program>: error: <what is wrong>``,
never a traceback, and nothing is written (no output replaced, no directory created).
:func:`run` gives a binary that behaviour for flag parsing and ``app.UsageError``:
absl alone prints the module docstring and the flag list and exits 1.
"""

from __future__ import annotations

import errno
import socket
import sys

OK = 0
FAILED = 1
BAD_INPUT = 2
BAD_STATE = 3
CANNOT_SERVE = 4
CLUSTER_UNAVAILABLE = 75      # EX_TEMPFAIL (antdt-coordinator, antdt-keras-trainer)


class CannotServe(Exception):
    """The address/port cannot be bound (exit :data:`CANNOT_SERVE`)."""


def one_line(message) -> str:
    """``message`` on one line (newlines and runs of spaces folded)."""
    return " ".join(str(message).split())


def error(program: str, message, code: int = BAD_INPUT) -> int:
    """Prints ``<program>: error: <message>`` (one line) to stderr; returns ``code``."""
    print(f"{program}: error: {one_line(message)}", file=sys.stderr, flush=True)
    return code


def run(main, program: str) -> None:
    """``absl.app.run(main)``, with bad flags and ``app.UsageError`` answered in one line
    and exit code :data:`BAD_INPUT` (``--help`` still prints the full help)."""
    from absl import app, flags

    def parse(argv):
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            sys.exit(error(program, f"{e} (--help lists the flags)"))

    def checked_main(argv):
        try:
            return main(argv)
        except app.UsageError as e:
            return error(program, e)

    app.run(checked_main, flags_parser=parse)


def check_bindable(host: str, port: int, flag: str = "--bind") -> None:
    """Raises :class:`CannotServe` (or ``ValueError`` for a host that is no address at
    all) unless ``host:port`` can be bound now, before anything else is started or
    written. gRPC would answer only "Failed to bind" (and the master's state dir would
    already exist). The socket is closed at once; a race with another process is still
    caught where the server binds."""
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"{flag}={host!r} is not an address or a resolvable name "
                         f"({getattr(e, 'strerror', None) or e})") from e
    failure = None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
                s.bind(address)
                return
        except OSError as e:
            failure = failure or e
    if failure is None:
        raise CannotServe(f"cannot bind {host}:{port}: no address")
    if failure.errno == errno.EADDRINUSE:
        raise CannotServe(f"port {port} on {host} is already in use (another process "
                          "listens there; pick another --port, or 0 for a free one)")
    if failure.errno == errno.EADDRNOTAVAIL:
        raise CannotServe(f"{flag}={host}: this address is not on this host (no interface "
                          "has it)")
    if failure.errno == errno.EACCES:
        raise CannotServe(f"cannot bind {host}:{port}: permission denied (ports below 1024 "
                          "need privileges)")
    raise CannotServe(f"cannot bind {host}:{port}: {failure.strerror or failure}")


def output_file_problem(path: str, flag: str, created_dir: str = "") -> str:
    """Why ``path`` cannot be written as a new file (its directory is missing or not a
    directory, or ``path`` is a directory), or "". Checked before the work starts, so a
    binary does not fail at the end (or after serving) on a typo.

    ``created_dir``: a directory the binary itself creates before it writes ``path``
    (antdt-launch's ``--workdir``). A path under it may name directories that do not
    exist yet; what must hold is that the part that exists is a writable directory."""
    import os

    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    if os.path.isdir(target):
        return f"{flag}={path} is a directory"
    if created_dir and _is_under(parent, os.path.abspath(created_dir)):
        existing = parent
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            return f"{flag}={path}: {existing} is not a directory"
        if not os.access(existing, os.W_OK | os.X_OK):
            return f"{flag}={path}: {existing} is not writable by this user"
        return ""
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.lexists(parent) else "does not exist"
        return f"{flag}={path}: its directory {parent} {what}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag}={path}: its directory {parent} is not writable by this user"
    return ""


def _is_under(path: str, directory: str) -> bool:
    import os

    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)
