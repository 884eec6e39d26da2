"""What one ``model.fit`` step of antdt-tf's Keras path costs, part by part (CPU per step,
per process), beside the same step without antdt-tf.

Usage::

    python -m benchmarks.keras_step_cost [--rounds=16] [--out=benchmarks/results/keras_step_cost.md]
        [--smoke]

``--smoke``: one closure per variant, no warm-up closures (tracing is in the measured
one): checks that the benchmark runs; not a measurement.

One real job on this machine: a master (``antdt_tf.master``), 1 PS and 1 worker
(``antdt-tf-server``) and this process as the chief, the Keras DeepFM (SGD, binary
cross-entropy) compiled with ``--steps_per_execution``. Variants are ``model.fit``'s own
train function (``make_train_function``, scheduled on the ClusterCoordinator as ``fit``
does), one closure of ``steps_per_execution`` steps at a time, **interleaved** (A B C D,
D C B A, ...) so that the machine's drift hits them alike:

``local``  the model's own ``train_step`` on a local ``tf.data`` pipeline of the same
           file (``shuffle().repeat().batch().map(decode).prefetch(2)``: bare
           tf-keras, setup (v) of ``compare_pss``).
``pulled`` the model's own ``train_step`` on :func:`antdt_tf.tf.keras.dataset_creator`'s
           pipeline (shards pulled from the master; ``record_id``/``antdt`` dropped):
           what the pull pipeline costs against ``local``.
``antdt``  :meth:`ShardingCallback.attach`'s step on the same pipeline (sparse reports,
           as ``antdt-keras-trainer`` runs): refused-lease skip, the PS record, the
           time accumulator, a report per lease.
``audit``  ``antdt`` with the audit counters (``--audit``: what the tests and
           ``compare_pss`` run).

Differences between rows are what a part costs. Per closure the CPU time of the worker,
PS, master and chief processes (psutil, 10 ms ticks: means over ``--rounds`` closures)
and the wall time.
"""

from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"   # before TensorFlow: tf.keras = tf-keras

from benchmarks import step_cost_harness as harness  # noqa: E402
from benchmarks.results_table import argparse_smoke  # noqa: E402

PARTS = ("worker", "ps", "master", "chief")
VARIANTS = ("local", "pulled", "antdt", "audit")
# --smoke: every variant, one closure each, no warm-up
SMOKE = {"rounds": 1, "warmup": 0}


def main() -> None:
    ap = harness.parser(__doc__, "benchmarks/results/keras_step_cost.md", rounds=16,
                        rounds_help="closures per variant", warmup=2,
                        warmup_help="unmeasured closures per variant first (tracing, first run)")
    ap.add_argument("--steps_per_execution", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ", ".join(VARIANTS))
    args = argparse_smoke(ap, SMOKE)
    args.variants = tuple(v for v in VARIANTS if v in args.variants.split(","))

    per_closure = args.steps_per_execution * args.batch_size
    # every pulling variant's closures plus its warm-up closures, and shards to spare
    num_records = (args.rounds + args.warmup) * 3 * per_closure + 8 * args.records_per_shard
    with harness.job("antdt-keras-step-cost-", num_records, args.records_per_shard) as job:
        rows = _measure(args, job)
    _write(args, rows, num_records)
    sys.stdout.flush()
    os._exit(0)   # TF's remote-function threads may crash an orderly interpreter exit


def _measure(args, job: harness.Job) -> dict:
    import tensorflow as tf

    from antdt_tf.models.keras_deepfm import build_keras_deepfm
    from antdt_tf.tf import keras as antdt_keras
    from antdt_tf.tf.cluster_spec import make_strategy
    from antdt_tf.tf import tf_internals
    from antdt_tf.tf.reader import decode_records

    keras = tf.keras
    spe, b, data, address = args.steps_per_execution, args.batch_size, job.data, job.address
    strategy = make_strategy(job.cluster.spec)
    with strategy.scope():
        model = build_keras_deepfm(args.buckets)
        model.compile(optimizer=keras.optimizers.SGD(0.2),
                      loss=keras.losses.BinaryCrossentropy(), steps_per_execution=spe)
    # fit() makes this (one per strategy) and its train function schedules on it
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    tf_internals.set_keras_coordinator(model, coordinator)
    own_step = model.train_step

    def local_fn(_context):
        raw = tf.data.TFRecordDataset(data).skip(1)   # record 0 is the .adtr header

        def to_keras(r):
            batch = decode_records(r)
            return {"dense": batch["dense"], "sparse": batch["sparse"]}, batch["label"]
        return raw.shuffle(10_000).repeat().batch(b).map(to_keras).prefetch(2)

    pulled = antdt_keras.dataset_creator(address, "train", b, sparse_reports=True,
                                         steps_per_execution=spe)

    def per_worker(fn):
        return iter(coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(fn)))

    local_it, pulled_it = per_worker(local_fn), per_worker(pulled)
    iterators = {"local": local_it, "pulled": pulled_it, "antdt": pulled_it,
                 "audit": pulled_it}
    measure = harness.cpu_clock(job.processes())

    def plain_step(data):   # the model's own step; the pipeline's two entries dropped
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        x = {k: v for k, v in x.items() if k not in ("antdt", "record_id")}
        return own_step((x, y, w))

    def run(name):
        fns[name](iterators[name])
        coordinator.join()

    # a train function traces model.train_step when it first runs: each is built and
    # run (twice: tracing, and its first run on the worker) while its step is set
    fns = {}
    steps = {"local": own_step, "pulled": plain_step}
    for name in args.variants:
        model.train_step = own_step
        if name in steps:
            model.train_step = steps[name]
        else:
            antdt_keras.ShardingCallback(
                address, "train", sparse_reports=True, worker_slots=1,
                audit_records=job.num_records if name == "audit" else 0).attach(model)
        model.train_function = None
        fns[name] = model.make_train_function(force=True)
        harness.warm_up(run, (name,), args.warmup)
    model.train_step = own_step
    return harness.interleaved(args.variants, args.rounds,
                               lambda name: measure(lambda: run(name)))


def _write(args, rows: dict, num_records: int) -> None:
    def notes(mean, total):
        def diff(a, b):
            parts = ", ".join(f"{k} {mean(a, k) - mean(b, k):+.2f}" for k in PARTS)
            return f"{total(a) - total(b):+.2f} ms CPU per step ({parts})"

        lines = [f"- {what} ({a} - {b}): {diff(a, b)}"
                 for a, b, what in (("pulled", "local", "the pull pipeline"),
                                    ("antdt", "pulled", "antdt-tf's step"),
                                    ("audit", "antdt", "the audit counters"))
                 if a in rows and b in rows]
        if "antdt" in rows and "local" in rows:
            lines.append(f"- the Keras path as antdt-keras-trainer runs it vs bare tf-keras: "
                         f"{total('antdt') / total('local'):.2f}x the CPU, "
                         f"{mean('antdt', 'wall') / mean('local', 'wall'):.2f}x the wall time "
                         "per step")
        return lines

    harness.write_results(
        args, harness.heading(
            "CPU per model.fit step of the Keras path",
            f"1 PS + 1 worker + master + chief, Keras DeepFM {args.buckets:,} buckets, batch "
            f"{args.batch_size}, {args.steps_per_execution} steps per execution, shards of "
            f"{args.records_per_shard:,}; {args.rounds} interleaved closures per variant, "
            "means"),
        rows, PARTS, args.steps_per_execution, notes,
        f"Reproduce: `python -m benchmarks.keras_step_cost --rounds={args.rounds} "
        f"--steps_per_execution={args.steps_per_execution} "
        + (f"--warmup={args.warmup} " if args.warmup != 2 else "")
        + f"--variants={','.join(args.variants)} --out={args.out}`; "
        f"{num_records:,} generated records.")


if __name__ == "__main__":
    main()
