"""The environment of the child processes a benchmark starts itself (task processes,
one-run workers); they end with ``antdt_tf.procutil.kill_group``."""

from __future__ import annotations

import os
import pathlib


def child_env() -> dict:
    """The environment of a benchmark's child: the repository first on ``PYTHONPATH`` (it
    runs ``python -m benchmarks....``), TensorFlow quiet and on the CPU."""
    from antdt_tf.procutil import child_env as antdt_child_env

    root = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return antdt_child_env(env)

