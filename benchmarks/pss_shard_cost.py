"""Fixed cost per shard of the two PSS data paths (pull and closure-per-shard).

Runs the same job (master + 1 PS + 2 workers + coordinator, DeepFM, synthetic data)
with 512 and with 8,192 records per shard, for both data paths of antdt-coordinator —
``pull`` (each worker's tf.data pipeline leases shards from the master; many steps per
closure) and ``closure`` (the coordinator schedules one closure per shard) — in paired
rounds, and reports the trainer's wall time (JCT without cluster start-up) of each; the
fixed cost per shard is the difference divided by the extra shards. This machine's
speed drifts, hence paired rounds and medians.

Usage: python -m benchmarks.pss_shard_cost [--records=65536] [--rounds=3]
       [--out=benchmarks/results/pss_shard_cost.md] [--smoke]

``--smoke``: one round of the four runs on 16,384 records: checks that the benchmark
runs; not a measurement.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

from benchmarks.results_table import argparse_smoke, write_table
from antdt_tf.data import criteo, records
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState
from antdt_tf.tf.local_cluster import LocalCluster, run_local_job

# --smoke: one round of the four runs (both paths, both shard sizes) on few records
SMOKE = {"records": 16_384, "rounds": 1}


def one_run(work: pathlib.Path, data: pathlib.Path, num_records: int, rps: int, batch: int,
            path: str):
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            LocalCluster(num_ps=1, num_workers=2, log_dir=work) as cluster, \
            ShardingClient(master.address) as admin:
        admin.register_dataset(DatasetSpec("train", records_per_shard=rps,
                                           files=(DataFile(str(data), num_records),)))
        report = run_local_job(work, master.address, cluster, batch, audit=False,
                               flags=[f"--data_path={path}"])
    assert report["records"] == num_records, report
    return report["seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=65_536)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/pss_shard_cost.md")
    args = argparse_smoke(ap, SMOKE)
    work = pathlib.Path(tempfile.mkdtemp(prefix="antdt-shardcost-"))
    data = work / "train.adtr"
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(args.records, seed=1)))
    sizes = (512, 8192)
    paths = ("pull", "closure")
    times = {(p, s): [] for p in paths for s in sizes}
    for r in range(args.rounds):
        for p in paths:
            for rps in sizes:
                run_dir = work / f"r{r}-{p}-{rps}"
                run_dir.mkdir()
                t = one_run(run_dir, data, args.records, rps, args.batch_size, p)
                times[p, rps].append(t)
                print(f"round {r}: {p:>7} {rps:>5} records/shard: {t:6.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = args.records // sizes[0] - args.records // sizes[1]
    lines = [
        f"PSS fixed cost per shard ({time.strftime('%Y-%m-%d')}; 1 PS, 2 workers, DeepFM, "
        f"{args.records:,} records, batch {args.batch_size}, {args.rounds} paired rounds, medians)",
        "",
        "| data path | records per shard | shards | trainer wall time (s) | records/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in paths:
        for s in sizes:
            lines.append(f"| {p} | {s:,} | {args.records // s} | {med[p, s]:.2f} | "
                         f"{args.records / med[p, s]:,.0f} |")
    lines.append("")
    for p in paths:
        fixed = (med[p, 512] - med[p, 8192]) / extra
        lines.append(f"- {p}: fixed cost per extra shard {fixed * 1e3:.1f} ms of JCT "
                     f"(≈ {2 * fixed * 1e3:.1f} ms of worker time with 2 workers busy).")
    write_table(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
