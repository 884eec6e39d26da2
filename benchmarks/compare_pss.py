"""Straggler tolerance: vanilla TF2 PSS vs TF1 static sharding vs antdt-tf, same model and data.

Usage::

    python -m benchmarks.compare_pss [--rounds=3] [--records=120000] [--setups=abc]
        [--out=benchmarks/results/compare_pss.md] [--smoke]

``--smoke``: the given setups, one round, no warm-up run, with the straggler only (its
throttle or injection runs; the no-straggler runs add no code path), on 24,576 records:
checks that the benchmark runs; not a measurement.

Every setup trains DeepFM's math on the same generated record file on 1 PS + 3 workers,
each a real process on 127.0.0.1, without and with worker 2 slowed ``--slowdown`` x by
``CpuThrottle``, in paired rounds; the table gives medians. The setups — (a) vanilla TF2
PSS, (b) TF1 static thirds, (c) antdt-tf, the diagnostics (s), (v), (t), (u), (c') and
antdt-tf's other APIs (m), (k) — and what JCT, ideal JCT, per-worker rate and
coordinator CPU mean: docs/benchmarks.md, "The PSS comparison: setups and definitions".

This module is the command line (the driver's flags and the internal ``--role`` of the
task processes it starts); the parts are in ``benchmarks/pss/`` (see its ``__init__``).
"""

from __future__ import annotations

import argparse

from benchmarks.pss.table import REPRODUCE_DEFAULTS

# --smoke: every setup asked for, once, with the straggler, on few records
SMOKE = {"rounds": 1, "warmup": 0, "records": 24_576, "stragglers": "only"}
ROLES = ("driver", "vanilla_chief", "keras_chief", "tf1_worker")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=REPRODUCE_DEFAULTS["warmup"], choices=(0, 1),
                    help="1: one uncounted run of the first setup before the rounds")
    ap.add_argument("--records", type=int, default=120_000)
    ap.add_argument("--batch_size", type=int, default=REPRODUCE_DEFAULTS["batch_size"])
    ap.add_argument("--buckets", type=int, default=1 << 16)
    ap.add_argument("--learning_rate", type=float, default=0.2)
    ap.add_argument("--records_per_shard", type=int,
                    default=REPRODUCE_DEFAULTS["records_per_shard"])
    ap.add_argument("--shuffle_buffer", type=int, default=10_000)
    ap.add_argument("--slowdown", type=float, default=4.0)
    ap.add_argument("--setups", default="abc", help="which setups to run, e.g. 'ac' (s: the "
                    "diagnostic TF2 PSS static-thirds loop, d: (c) without periodic checkpoints, m: antdt "
                    "on TF1 MonitoredTrainingSession hooks, t: (b) with (m)'s TF1 model, u: (t) "
                    "started and checkpointed as (m) is, k: antdt with "
                    "Keras model.fit, v: bare tf-keras model.fit)")
    ap.add_argument("--stragglers", default=REPRODUCE_DEFAULTS["stragglers"],
                    choices=["both", "none", "only"],
                    help="run each setup without the straggler, with it, or both")
    ap.add_argument("--out", default="benchmarks/results/compare_pss.md")
    ap.add_argument("--workdir", default="", help="default: a new temp dir (kept)")
    # internal: the processes this benchmark starts (benchmarks/pss/chiefs.py, tf1_worker.py)
    ap.add_argument("--role", default="driver", choices=list(ROLES))
    ap.add_argument("--data", default="")
    ap.add_argument("--static_thirds", action="store_true")
    ap.add_argument("--tf1_model", action="store_true")
    ap.add_argument("--as_job", action="store_true")
    ap.add_argument("--cluster", default="")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--sync_dir", default="")
    ap.add_argument("--result", default="")
    return ap


def main():
    from benchmarks.results_table import argparse_smoke

    args = argparse_smoke(parser(), SMOKE)
    if args.role == "vanilla_chief":
        from benchmarks.pss.chiefs import vanilla_chief
        return vanilla_chief(args)
    if args.role == "keras_chief":
        from benchmarks.pss.chiefs import keras_chief
        return keras_chief(args)
    if args.role == "tf1_worker":
        from benchmarks.pss.tf1_worker import tf1_worker
        return tf1_worker(args)
    from benchmarks.pss import driver
    return driver.run(args)


if __name__ == "__main__":
    main()
