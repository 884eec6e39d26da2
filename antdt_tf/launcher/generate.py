"""Synthetic data for a job that has none (``antdt-launch --generate_records``)."""

from __future__ import annotations

import functools
import pathlib


def generated_paths(workdir: pathlib.Path, held_out: int) -> tuple[str, str]:
    """Where :func:`generate_data` writes the training and held-out records ("" when
    there are none held out)."""
    data_dir = workdir / "data"
    return str(data_dir / "train.adtr"), str(data_dir / "eval.adtr") if held_out else ""


def generate_data(workdir: pathlib.Path, train: int, held_out: int, seed: int):
    """Writes ``train`` + ``held_out`` records of one synthetic dataset (one hidden model)
    as two record files. Returns their paths."""
    from antdt_tf.data import criteo, records

    (workdir / "data").mkdir(parents=True, exist_ok=True)
    spec = criteo.SyntheticSpec(train + held_out, seed=seed)
    part = functools.partial(criteo.records_between, spec)
    train_path, held_out_path = generated_paths(workdir, held_out)
    records.write_records(train_path, part(0, train))
    if held_out:
        records.write_records(held_out_path, part(train, train + held_out))
    return train_path, held_out_path
