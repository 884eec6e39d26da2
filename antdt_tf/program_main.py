"""Runs a job's own program as ``python`` would: ``python -m antdt_tf.program_main
PROGRAM [ARGS...]``, where PROGRAM is ``/dir/train.py`` (run as ``__main__`` with its
directory first on the import path, as ``python /dir/train.py`` does), ``pkg.module``
(run as ``python -m pkg.module`` does) or ``pkg.module:function`` (imported, then
``function()`` called; its return value is the exit code). ``sys.argv`` is
``[PROGRAM, *ARGS]``. The agent starts every job program through here, after checking
it (``antdt_tf.agent.programs``); the module's import root comes in ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

from antdt_tf.program import STANDBY_ADDRESS_ENV, STANDBY_FILE_ENV


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m antdt_tf.program_main PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    program, args = argv[1], argv[2:]
    standby = os.environ.pop(STANDBY_FILE_ENV, "")
    address = os.environ.pop(STANDBY_ADDRESS_ENV, "")
    if standby:      # moving hosts: the slow imports first, then take over the address
        import tensorflow  # noqa: F401

        from antdt_tf.procutil import stand_by

        stand_by(standby, address, 120, os.environ.get("ANTDT_ROLE", "task"))
    sys.argv = [program, *args]
    if program.endswith(".py"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
        runpy.run_path(program, run_name="__main__")
        return 0
    module, _, function = program.partition(":")
    if not function:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    code = getattr(importlib.import_module(module), function)()
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
