"""Where the driver and the task processes it starts meet: files in the run's sync
directory (``ready_chief``/``ready_<i>`` once a process is ready to train, ``go`` from
the driver, ``chief_initialized``, ``done_<i>``) and the result each process writes as
JSON once it measured everything."""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time


def wait_file(path: pathlib.Path, timeout: float = 300.0, poll: float = 0.005) -> float:
    """Until ``path`` exists; the unix time it was seen."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(poll)
    return time.time()


def touch(path: pathlib.Path) -> None:
    """Creates ``path`` at once (written aside, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(time.time()))
    os.replace(tmp, path)


def audit_counts(counts) -> dict:
    """How many records were applied 0, 1 and 2+ times, from the per-record counter."""
    import numpy as np

    counts = np.asarray(counts)
    return {"applied_0": int((counts == 0).sum()), "applied_1": int((counts == 1).sum()),
            "applied_2plus": int((counts >= 2).sum())}


def finish(path: str, result: dict, done: pathlib.Path | None = None) -> None:
    """Writes the process's ``result``, then ``done`` (if given), and exits at once:
    TensorFlow's teardown (a ClusterCoordinator's, a session's) can linger, and
    everything is written."""
    pathlib.Path(path).write_text(json.dumps(result))
    if done is not None:
        touch(done)
    sys.stdout.flush()
    os._exit(0)
