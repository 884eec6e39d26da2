"""What one training step of the pull path costs, part by part (CPU per step, per process).

Usage::

    python -m benchmarks.step_cost [--rounds=24] [--out=benchmarks/results/step_cost.md]
        [--smoke]

``--smoke``: one closure per variant, no warm-up closures (tracing is in the measured
one): checks that the benchmark runs; not a measurement.

One real job on this machine: a master (``antdt_tf.master``), 1 PS and 1 worker
(``antdt-tf-server``) and this process as the chief, DeepFM on a generated record file,
batch ``--batch_size``, closures of ``--steps_per_closure`` steps on the worker's pulled
dataset (``pull_dataset``). Variants, each a closure function, scheduled one at a time
and **interleaved** (A B C, C B A, ...) so that the machine's drift hits them alike:

``antdt``     ``PullTrainer``'s own closure function as the launcher runs it (sparse
              reports): step, per-worker counters, the lease record on the PS, and a
              report to the master when a lease is finished and at the closure's end.
``dense``     ``PullTrainer`` without sparse reports: the report to the master after
              every step (what bounded a failure to one batch before the PS record).
``no_report`` the same loop and counters without any report (its leases are never
              reported: only a cost probe).
``bare``      the same loop, the step alone.

Per closure it takes the CPU time of the worker, PS, master and chief processes (psutil,
10 ms ticks: means over ``--rounds`` closures) and the wall time. Differences between
rows are what a part costs: ``dense - no_report`` = the per-step report (worker RPC
client, master, and the PS waiting on it), ``antdt - no_report`` = what is left of it
with sparse reports, ``no_report - bare`` = the counters.
"""

from __future__ import annotations

import os
import sys

from benchmarks import step_cost_harness as harness
from benchmarks.results_table import argparse_smoke

NUM_WORKERS = 1
PARTS = ("worker", "ps", "master", "chief")
VARIANTS = ("antdt", "dense", "no_report", "bare")
# --smoke: every variant, one closure each, no warm-up
SMOKE = {"rounds": 1, "warmup": 0}


def _loop(tf, strategy, model, counters, steps_per_closure: int, counts: bool):
    """PullTrainer's closure loop without the report (and without the counters)."""
    from antdt_tf.tf.accounting import batch_counts
    from antdt_tf.tf.pull import no_records

    @tf.function
    def closure(iterator):
        worker = tf.reshape(tf.cast(
            tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64), [1])

        def replica_fn(batch, worker):
            meta = batch.pop("antdt")
            ids = batch.pop("record_id")
            if counts:
                counters.scatter_add(tf.IndexedSlices(
                    tf.reshape(batch_counts(meta), [1, 2]), worker))
            model.train_step(batch, ids)
            return tf.constant(0, tf.int64)

        def fetch():
            batch = iterator.get_next_as_optional()
            value = tf.cond(batch.has_value(), batch.get_value,
                            lambda: no_records(iterator.element_spec))
            return value, tf.shape(value["label"])[0] > 0

        def body(i, more, value):   # the step guarded by the loop's predicate
            strategy.run(replica_fn, args=(value, worker))
            value, more = tf.cond(i + 1 < steps_per_closure, fetch,
                                  lambda: (no_records(iterator.element_spec), tf.constant(False)))
            return i + 1, more, value

        value, more = fetch()
        tf.while_loop(lambda i, more, value: more, body, [tf.constant(0), more, value])
    return closure


def main() -> None:
    ap = harness.parser(__doc__, "benchmarks/results/step_cost.md", rounds=24,
                        rounds_help="closures per variant", warmup=2,
                        warmup_help="unmeasured closures per variant first (tracing, first run)")
    ap.add_argument("--steps_per_closure", type=int, default=16)
    args = argparse_smoke(ap, SMOKE)

    per_closure = args.steps_per_closure * args.batch_size
    # every variant's closures plus its warm-up closures, and a shard to spare
    num_records = ((args.rounds + args.warmup) * len(VARIANTS) * per_closure
                   + 4 * args.records_per_shard)
    with harness.job("antdt-step-cost-", num_records, args.records_per_shard) as job:
        rows = _measure(args, job)
    _write(args, rows, num_records)
    sys.stdout.flush()
    os._exit(0)   # TF's remote-function threads may crash an orderly interpreter exit


def _measure(args, job: harness.Job) -> dict:
    import tensorflow as tf

    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.tf.cluster_spec import make_strategy
    from antdt_tf.tf.pull import PullTrainer, pull_dataset

    strategy = make_strategy(job.cluster.spec)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = DeepFM(buckets=args.buckets, learning_rate=0.2)
    def trainer(**kw):
        return PullTrainer(strategy, coordinator, job.address, "train", model.train_step,
                           args.batch_size, num_workers=NUM_WORKERS, progress_fn=None,
                           steps_per_closure=args.steps_per_closure, **kw)

    # (no worker dies here: nothing is ever held, the record_fn is never called)
    sparse, dense = trainer(record_fn=lambda *a: True), trainer()
    counters = sparse._worker_counts
    closures = {"antdt": sparse._train,   # PullTrainer's own closure functions
                "dense": dense._train,
                "no_report": _loop(tf, strategy, model, counters, args.steps_per_closure, True),
                "bare": _loop(tf, strategy, model, counters, args.steps_per_closure, False)}
    batch_size, address = args.batch_size, job.address
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: pull_dataset(address, "train", batch_size, wait_markers=True,
                             sparse_reports=True)))
    measure = harness.cpu_clock(job.processes())

    def run(name):
        coordinator.schedule(closures[name], args=(iterator,))
        coordinator.join()

    harness.warm_up(run, VARIANTS, args.warmup)   # tracing, each function's first run
    return harness.interleaved(VARIANTS, args.rounds, lambda name: measure(lambda: run(name)))


def _write(args, rows: dict, num_records: int) -> None:
    def notes(mean, total):
        report = total("dense") - total("no_report")
        left = total("antdt") - total("no_report")
        return [f"- the report after every step (dense): {report:.2f} ms of CPU per step "
                f"({report / total('dense'):.0%} of the step's total): worker "
                f"{mean('dense', 'worker') - mean('no_report', 'worker'):.2f}, master "
                f"{mean('dense', 'master') - mean('no_report', 'master'):.2f}, PS "
                f"{mean('dense', 'ps') - mean('no_report', 'ps'):.2f}",
                f"- sparse reports (PS record per step, a report per lease and closure): "
                f"{left:.2f} ms per step ({left / total('antdt'):.0%}); the step costs "
                f"{total('antdt') / total('dense'):.2f}x of the dense one",
                f"- the per-worker counters: {total('no_report') - total('bare'):.2f} ms per step"]

    harness.write_results(
        args, harness.heading(
            "CPU per training step of the pull path",
            f"1 PS + 1 worker + master + chief, DeepFM {args.buckets:,} buckets, batch "
            f"{args.batch_size}, {args.steps_per_closure} steps per closure, shards of "
            f"{args.records_per_shard:,}; {args.rounds} interleaved closures per variant, "
            "means"),
        rows, PARTS, args.steps_per_closure, notes,
        f"Reproduce: `python -m benchmarks.step_cost --rounds={args.rounds} "
        + (f"--warmup={args.warmup} " if args.warmup != 2 else "")
        + f"--out={args.out}` (or `make bench-step-cost`); {num_records:,} generated "
        "records.")


if __name__ == "__main__":
    main()
