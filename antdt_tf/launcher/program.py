"""``antdt-launch --program``: the job's own program and its data, as the spec names them.

The submitter resolves what only it can: a program file's absolute path (every host runs
it from there), a module's code directory (default: the current directory, as
``python -m`` has it), and the records of every data file in the user's format
(``antdt_tf.data.files``) -- the master shards by record position and never reads the
data itself.
"""

from __future__ import annotations

import os
import pathlib

from antdt_tf.agent.programs import BUILTIN_PROGRAMS, module_file
from antdt_tf.data import files as data_files
from antdt_tf.errors import DataError, InvalidRequest


def resolve_program(program: str, code_dir: str, remote: bool) -> tuple[str, str]:
    """``(program, code_dir)`` as the spec carries them; InvalidRequest saying what is
    wrong. ``remote``: the paths are on the cluster (Kubernetes), not checked here."""
    if program.endswith(".py"):
        if code_dir:
            raise InvalidRequest("--code_dir goes with a module program (pkg.module"
                                 "[:function]); a program file runs from its directory")
        if remote:
            return program, ""
        path = pathlib.Path(program).resolve()
        if not path.is_file():
            raise InvalidRequest(f"--program={program}: no such file")
        return str(path), ""
    module = program.partition(":")[0]
    if module in BUILTIN_PROGRAMS and not code_dir:
        return program, ""
    if remote:
        return program, code_dir
    root = pathlib.Path(code_dir or os.getcwd()).resolve()
    if not module_file(str(root), module):       # where the agent will look for it
        raise InvalidRequest(f"--program={program}: module {module} is not in {root} "
                             "(pass --code_dir=the directory its package is in)")
    return program, str(root)


def count_data(data: str, data_format: str, code_dir: str = "") -> list[tuple[str, int]]:
    """``--data`` (comma-separated files and globs) as ``[(path, records)]``, counted in
    ``--data_format`` (``auto``: by the files' names); DataError saying what is wrong."""
    paths = data_files.expand([p for p in data.split(",") if p])
    if not paths:
        raise DataError("--data names no file")
    fmt = data_files.guess_format(paths) if data_format in ("", "auto") else data_format
    return data_files.count_files(paths, fmt, code_dir)
