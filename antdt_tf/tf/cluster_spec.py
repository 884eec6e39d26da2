"""Parsing the ``--cluster`` flag shared by the TF task and coordinator binaries."""

from __future__ import annotations

import json

from absl import app


def parse_cluster_flag(text: str) -> dict:
    """``--cluster`` JSON (job name -> list of host:port) or a UsageError saying why not."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise app.UsageError(f"--cluster is not valid JSON: {e}") from e
    if not isinstance(spec, dict) or not all(
            isinstance(v, list) and all(isinstance(a, str) for a in v) for v in spec.values()):
        raise app.UsageError('--cluster must map job names to lists of "host:port"')
    return spec
