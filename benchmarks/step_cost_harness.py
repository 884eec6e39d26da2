"""What the step-cost benchmarks share (``step_cost``, ``keras_step_cost``,
``tf1_step_cost``): their common flags, the job they measure in (a generated record file,
a master, one PS and one worker), the interleaved timing loop and its warm-up, the CPU of
each process around a run, and the results table of CPU per step by variant."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import subprocess
import tempfile
import time

from antdt_tf.procutil import kill_group
from benchmarks.results_table import per_step_stats, write_table

# a process's column in the results table
PART_HEADS = {"worker": "worker CPU ms/step", "ps": "PS", "master": "master", "chief": "chief"}


def parser(doc: str, out: str, rounds: int, rounds_help: str, warmup: int, warmup_help: str,
           batch_size: int = 256, records_per_shard: int = 2048) -> argparse.ArgumentParser:
    """The flags every step-cost benchmark has (the benchmark adds its own, then parses
    with ``results_table.argparse_smoke``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    ap.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    ap.add_argument("--batch_size", type=int, default=batch_size)
    ap.add_argument("--buckets", type=int, default=1 << 16)
    ap.add_argument("--records_per_shard", type=int, default=records_per_shard)
    ap.add_argument("--out", default=out)
    return ap


@dataclasses.dataclass
class Job:
    work: pathlib.Path             # a new temp dir: data, logs
    data: str                      # the generated record file
    num_records: int
    master: subprocess.Popen
    address: str                   # the master's
    cluster: object                # a LocalCluster

    def processes(self) -> dict:
        """``psutil.Process`` of the worker, the PS, the master and this process (the
        chief), by part."""
        import psutil

        return {"worker": psutil.Process(self.cluster.procs["worker", 0].pid),
                "ps": psutil.Process(self.cluster.procs["ps", 0].pid),
                "master": psutil.Process(self.master.pid), "chief": psutil.Process()}


@contextlib.contextmanager
def job(prefix: str, num_records: int, records_per_shard: int = 0, own_worker: bool = False):
    """A :class:`Job` to measure steps in, stopped on exit: ``num_records`` generated
    records, a master (the dataset ``train`` registered with shards of
    ``records_per_shard`` when given), 1 PS and 1 worker (``antdt-tf-server``). With
    ``own_worker`` only the PS is started: the spec's worker address is for a process of
    the benchmark's own."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from antdt_tf.data import criteo, records
    from antdt_tf.procutil import start_master
    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.sharding.plan import DataFile, DatasetSpec
    from antdt_tf.tf.local_cluster import LocalCluster, free_ports

    work = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    data = str(work / "train.adtr")
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(num_records, seed=1)))
    master, address = start_master(work)
    try:
        if records_per_shard:
            with ShardingClient(address, timeout=30) as admin:
                admin.register_dataset(DatasetSpec("train", records_per_shard=records_per_shard,
                                                   files=(DataFile(data, num_records),)))
        if own_worker:
            cluster = LocalCluster(num_ps=1, num_workers=0, log_dir=work)
            cluster.spec = {"ps": cluster.spec["ps"],
                            "worker": [f"127.0.0.1:{free_ports(1)[0]}"]}
            try:
                cluster.start_task("ps", 0)
                yield Job(work, data, num_records, master, address, cluster)
            finally:
                cluster.stop()
        else:
            with LocalCluster(num_ps=1, num_workers=1, log_dir=work) as cluster:
                yield Job(work, data, num_records, master, address, cluster)
    finally:
        kill_group(master)


def cpu_clock(procs: dict):
    """``measure(fn)``: runs ``fn()``; returns its wall time and the CPU seconds (user +
    system) each of ``procs`` (part -> ``psutil.Process``) spent meanwhile."""
    def cpu():
        return {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}

    def measure(fn) -> dict:
        c0, t0 = cpu(), time.perf_counter()
        fn()
        t1, c1 = time.perf_counter(), cpu()
        return {"wall": t1 - t0, **{k: c1[k] - c0[k] for k in procs}}
    return measure


def warm_up(run, variants, times: int) -> None:
    """``times`` unmeasured runs of each variant (tracing, its first run on the worker)."""
    for name in variants:
        for _ in range(times):
            run(name)


def interleaved(variants, rounds: int, run, show_variant: bool = False) -> dict:
    """``{variant: [run(variant), ...]}`` over ``rounds`` rounds, each running every
    variant once, odd rounds in reverse order (A B C, C B A, ...): the machine's drift
    hits every variant alike."""
    rows = {name: [] for name in variants}
    for r in range(rounds):
        for name in (variants if r % 2 == 0 else variants[::-1]):
            rows[name].append(run(name))
            if show_variant:
                print(f"\rround {r + 1}/{rounds} {name:<8}", end="", flush=True)
        if not show_variant:
            print(f"\rround {r + 1}/{rounds}", end="", flush=True)
    print()
    return rows


def heading(what: str, details: str) -> str:
    return f"# {what} ({time.strftime('%Y-%m-%d')}; {os.cpu_count()} cores, {details})"


def write_results(args, title: str, rows: dict, parts, steps: int, notes, reproduce: str) -> None:
    """The results file: ``title``, a row per variant (wall and CPU ms per step of each of
    ``parts``, their total ± its standard error; ``rows[variant]`` are runs of ``steps``
    steps each), then ``notes(mean, total)`` (lines) and ``reproduce``."""
    mean, total, stderr = per_step_stats(rows, parts, steps)
    lines = [title, "",
             "| variant | wall ms/step | " + " | ".join(PART_HEADS[k] for k in parts)
             + " | total CPU ms/step (± s.e.) |", "|---|" + "---:|" * (len(parts) + 2)]
    for name in rows:
        lines.append(f"| {name} | {mean(name, 'wall'):.2f} | " + " | ".join(
            f"{mean(name, k):.2f}" for k in parts) + f" | {total(name):.2f} ± {stderr(name):.2f} |")
    lines += ["", *notes(mean, total), "", reproduce]
    write_table(args.out, lines, smoke=args.smoke)
