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

import argparse
import os
import pathlib
import signal
import sys
import tempfile
import time

NUM_PS, NUM_WORKERS = 1, 1
PARTS = ("worker", "ps", "master", "chief")
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=24, help="closures per variant")
    ap.add_argument("--warmup", type=int, default=2,
                    help="unmeasured closures per variant first (tracing, first run)")
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--steps_per_closure", type=int, default=16)
    ap.add_argument("--buckets", type=int, default=1 << 16)
    ap.add_argument("--records_per_shard", type=int, default=2048)
    ap.add_argument("--out", default="benchmarks/results/step_cost.md")
    from benchmarks.results_table import argparse_smoke

    args = argparse_smoke(ap, SMOKE)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import psutil

    from antdt_tf.data import criteo, records
    from antdt_tf.procutil import start_master
    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.sharding.plan import DataFile, DatasetSpec
    from antdt_tf.tf.local_cluster import LocalCluster

    variants = ("antdt", "dense", "no_report", "bare")
    per_closure = args.steps_per_closure * args.batch_size
    # every variant's closures plus its warm-up closures, and a shard to spare
    num_records = ((args.rounds + args.warmup) * len(variants) * per_closure
                   + 4 * args.records_per_shard)
    work = pathlib.Path(tempfile.mkdtemp(prefix="antdt-step-cost-"))
    data = str(work / "train.adtr")
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(num_records, seed=1)))
    master, address = start_master(work)
    try:
        with ShardingClient(address, timeout=30) as admin:
            admin.register_dataset(DatasetSpec("train", records_per_shard=args.records_per_shard,
                                               files=(DataFile(data, num_records),)))
        with LocalCluster(num_ps=NUM_PS, num_workers=NUM_WORKERS, log_dir=work) as cluster:
            rows = _measure(args, address, cluster, master, variants, psutil)
    finally:
        os.killpg(master.pid, signal.SIGKILL)
        master.wait()
    _write(args, rows, num_records)
    sys.stdout.flush()
    os._exit(0)   # TF's remote-function threads may crash an orderly interpreter exit


def _measure(args, address, cluster, master, variants, psutil) -> dict:
    import tensorflow as tf

    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.tf.cluster_spec import make_strategy
    from antdt_tf.tf.pull import PullTrainer, pull_dataset

    strategy = make_strategy(cluster.spec)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = DeepFM(buckets=args.buckets, learning_rate=0.2)
    def trainer(**kw):
        return PullTrainer(strategy, coordinator, address, "train", model.train_step,
                           args.batch_size, num_workers=NUM_WORKERS, progress_fn=None,
                           steps_per_closure=args.steps_per_closure, **kw)

    # (no worker dies here: nothing is ever held, the record_fn is never called)
    sparse, dense = trainer(record_fn=lambda *a: True), trainer()
    counters = sparse._worker_counts
    closures = {"antdt": sparse._train,   # PullTrainer's own closure functions
                "dense": dense._train,
                "no_report": _loop(tf, strategy, model, counters, args.steps_per_closure, True),
                "bare": _loop(tf, strategy, model, counters, args.steps_per_closure, False)}
    batch_size = args.batch_size
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: pull_dataset(address, "train", batch_size, wait_markers=True,
                             sparse_reports=True)))
    procs = {"worker": psutil.Process(cluster.procs["worker", 0].pid),
             "ps": psutil.Process(cluster.procs["ps", 0].pid),
             "master": psutil.Process(master.pid), "chief": psutil.Process()}

    def cpu():
        return {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}

    def run(name):
        coordinator.schedule(closures[name], args=(iterator,))
        coordinator.join()

    for name in variants:   # tracing and each function's first run on the worker
        for _ in range(args.warmup):
            run(name)
    rows = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in (variants if r % 2 == 0 else variants[::-1]):
            c0, t0 = cpu(), time.perf_counter()
            run(name)
            t1, c1 = time.perf_counter(), cpu()
            rows[name].append({"wall": t1 - t0, **{k: c1[k] - c0[k] for k in PARTS}})
        print(f"\rround {r + 1}/{args.rounds}", end="", flush=True)
    print()
    return rows


def _write(args, rows: dict, num_records: int) -> None:
    from benchmarks.results_table import per_step_stats, write_table

    mean, total, stderr = per_step_stats(rows, PARTS, args.steps_per_closure)

    lines = [f"# CPU per training step of the pull path ({time.strftime('%Y-%m-%d')}; "
             f"{os.cpu_count()} cores, 1 PS + 1 worker + master + chief, DeepFM "
             f"{args.buckets:,} buckets, batch {args.batch_size}, "
             f"{args.steps_per_closure} steps per closure, shards of "
             f"{args.records_per_shard:,}; {args.rounds} interleaved closures per variant, "
             "means)", "",
             "| variant | wall ms/step | worker CPU ms/step | PS | master | chief | "
             "total CPU ms/step (± s.e.) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in rows:
        lines.append(f"| {name} | {mean(name, 'wall'):.2f} | " + " | ".join(
            f"{mean(name, k):.2f}" for k in PARTS) + f" | {total(name):.2f} ± {stderr(name):.2f} |")
    report = total("dense") - total("no_report")
    left = total("antdt") - total("no_report")
    lines += ["", f"- the report after every step (dense): {report:.2f} ms of CPU per step "
              f"({report / total('dense'):.0%} of the step's total): worker "
              f"{mean('dense', 'worker') - mean('no_report', 'worker'):.2f}, master "
              f"{mean('dense', 'master') - mean('no_report', 'master'):.2f}, PS "
              f"{mean('dense', 'ps') - mean('no_report', 'ps'):.2f}",
              f"- sparse reports (PS record per step, a report per lease and closure): "
              f"{left:.2f} ms per step ({left / total('antdt'):.0%}); the step costs "
              f"{total('antdt') / total('dense'):.2f}x of the dense one",
              f"- the per-worker counters: {total('no_report') - total('bare'):.2f} ms per step",
              "", f"Reproduce: `python -m benchmarks.step_cost --rounds={args.rounds} "
              + (f"--warmup={args.warmup} " if args.warmup != 2 else "")
              + f"--out={args.out}` (or `make bench-step-cost`); {num_records:,} generated "
              "records."]
    write_table(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
