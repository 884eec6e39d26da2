"""Synthetic data for a job that has none (``antdt-launch --generate_records``)."""

from __future__ import annotations

import functools
import pathlib


def generate_data(workdir: pathlib.Path, train: int, held_out: int, seed: int):
    """Writes ``train`` + ``held_out`` records of one synthetic dataset (one hidden model)
    as two record files. Returns their paths."""
    from antdt_tf.data import criteo, records

    data_dir = workdir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    spec = criteo.SyntheticSpec(train + held_out, seed=seed)
    part = functools.partial(criteo.records_between, spec)

    paths = data_dir / "train.adtr", data_dir / "eval.adtr"
    records.write_records(paths[0], part(0, train))
    if held_out:
        records.write_records(paths[1], part(train, train + held_out))
    return str(paths[0]), str(paths[1]) if held_out else ""
