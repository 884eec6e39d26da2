"""Sharding service benchmark: GetShard+ReportShard pairs/s and latency, plan memory.

Starts a real ``antdt-master`` (loopback, persistent state_dir, fsync=interval) and
drives it from a separate load-generator process (grpc.aio), 1, 8 and 64 concurrent
clients, in two modes:

- ``2 RPCs``: GetShard, then ReportShard(DONE): one pair = two round trips.
- ``piggyback``: ReportShard(DONE, get_next=True): the report also returns the next
  shard, one unary round trip per pair.
- ``stream``: the same report+next as messages on one ShardStream per client (a
  trainer's long-lived session; how antdt-tf's own trainers pull).

Load generators share the 2 cores with the master, so the numbers are a lower bound
for a master on its own host; the master's own CPU time per pair is reported too
(1e6 / that = pairs/s one dedicated core could serve). Also measures the master's RSS growth and time to
register a 1e6-shard (1e9-record) dataset.

Usage: python -m benchmarks.sharding_bench [--seconds=5] [--clients=1,8,64]
       [--out=benchmarks/results/sharding.md] [--smoke]

``--smoke``: 1 s per row and 8 clients only (every mode still runs): checks that the
benchmark runs; not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import pathlib
import signal
import statistics
import tempfile
import time

import grpc
import psutil

from benchmarks.results_table import argparse_smoke, write_table
from antdt_tf.procutil import start_master
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.proto import sharding_pb2_grpc as pb_grpc

SHARD = pb.GetShardResponse.SHARD
# --smoke: every mode, one client count, 1 s per row
SMOKE = {"seconds": 1.0, "clients": "8"}


async def _client_loop(stub, dataset, task, until, piggyback, latencies):
    resp = await stub.GetShard(pb.GetShardRequest(dataset=dataset, task=task))
    while time.perf_counter() < until:
        assert resp.status == SHARD, resp
        s = resp.shard
        t0 = time.perf_counter()
        report = pb.ReportShardRequest(dataset=dataset, task=task, lease_id=s.lease_id,
                                       shard_id=s.shard_id, epoch=s.epoch,
                                       outcome=pb.ReportShardRequest.DONE,
                                       records_processed=s.length, get_next=piggyback)
        if piggyback:
            resp = (await stub.ReportShard(report)).next
        else:
            await stub.ReportShard(report)
            resp = await stub.GetShard(pb.GetShardRequest(dataset=dataset, task=task))
        latencies.append(time.perf_counter() - t0)


async def _stream_loop(stub, dataset, task, until, latencies):
    call = stub.ShardStream()
    await call.write(pb.ShardStreamRequest(seq=1, get_shard=pb.GetShardRequest(
        dataset=dataset, task=task)))
    resp = (await call.read()).get_shard
    seq = 1
    while time.perf_counter() < until:
        assert resp.status == SHARD, resp
        s = resp.shard
        seq += 1
        t0 = time.perf_counter()
        await call.write(pb.ShardStreamRequest(seq=seq, report_shard=pb.ReportShardRequest(
            dataset=dataset, task=task, lease_id=s.lease_id, shard_id=s.shard_id, epoch=s.epoch,
            outcome=pb.ReportShardRequest.DONE, records_processed=s.length, get_next=True)))
        answer = await call.read()
        assert not answer.HasField("error"), answer.error
        resp = answer.report_shard.next
        latencies.append(time.perf_counter() - t0)
    await call.done_writing()


def _load_process(address, dataset, first_task, clients, start_at, seconds, mode, queue):
    async def run():
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.ShardingServiceStub(channel)
            latencies: list[float] = []
            while time.time() < start_at:
                await asyncio.sleep(0.01)
            until = time.perf_counter() + seconds
            tasks = [pb.TaskId(type="worker", index=first_task + i) for i in range(clients)]
            if mode == "stream":
                loops = [_stream_loop(stub, dataset, t, until, latencies) for t in tasks]
            else:
                loops = [_client_loop(stub, dataset, t, until, mode == "piggyback", latencies)
                         for t in tasks]
            await asyncio.gather(*loops)
            return latencies
    try:
        import uvloop
        queue.put(uvloop.run(run()))
    except ImportError:
        queue.put(asyncio.run(run()))


def measure(address, dataset, clients, seconds, mode, procs=1):
    procs = min(procs, clients)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 2.0   # after every process imported and connected
    workers = []
    for p in range(procs):
        share = clients // procs + (1 if p < clients % procs else 0)
        first = sum(clients // procs + (1 if q < clients % procs else 0) for q in range(p))
        w = ctx.Process(target=_load_process, args=(address, dataset, first + 1000 * clients,
                                                    share, start_at, seconds, mode, queue))
        w.start()
        workers.append(w)
    latencies = []
    for _ in workers:
        latencies.extend(queue.get(timeout=seconds + 60))
    for w in workers:
        w.join()
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return {"pairs_s": len(latencies) / seconds, "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", default="1,8,64", help="concurrent clients per row")
    ap.add_argument("--out", default="benchmarks/results/sharding.md")
    args = argparse_smoke(ap, SMOKE)
    client_counts = [int(c) for c in args.clients.split(",")]
    work = pathlib.Path(tempfile.mkdtemp(prefix="antdt-bench-"))
    master, address = start_master(work, "--fsync=interval")
    try:
        proc = psutil.Process(master.pid)
        channel = grpc.insecure_channel(address)
        stub = pb_grpc.ShardingServiceStub(channel)
        stub.GetProgress(pb.GetProgressRequest(), wait_for_ready=True, timeout=30)
        rss0 = proc.memory_info().rss
        t0 = time.perf_counter()
        reg = stub.RegisterDataset(pb.RegisterDatasetRequest(spec=pb.DatasetSpec(
            name="big", num_records=10**9, records_per_shard=1000, num_epochs=100,
            shuffle=True, seed=1)), timeout=60)
        register_s = time.perf_counter() - t0
        rss1 = proc.memory_info().rss
        rows = []
        for mode in ("2 RPCs", "piggyback", "stream"):
            for clients in client_counts:
                cpu0 = proc.cpu_times()
                r = measure(address, "big", clients, args.seconds, mode)
                cpu1 = proc.cpu_times()
                used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
                r.update(clients=clients, mode=mode,
                         master_us=used / (r["pairs_s"] * args.seconds) * 1e6)
                rows.append(r)
                print(f"{r['mode']:>9} clients={clients:<3} {r['pairs_s']:8.0f} pairs/s  "
                      f"p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
                      f"master {r['master_us']:.0f} us CPU/pair", flush=True)
        rss2 = proc.memory_info().rss
        channel.close()
    finally:
        os.killpg(master.pid, signal.SIGTERM)
        master.wait(timeout=30)
    lines = [
        f"Sharding service benchmark ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"load generators on the same machine, {args.seconds:.0f} s per row, "
        "persistent state_dir with fsync=interval)",
        "",
        "| mode | clients | pairs/s | p50 ms | p99 ms | master CPU µs/pair |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['clients']} | {r['pairs_s']:,.0f} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['master_us']:.0f} |")
    lines += [
        "",
        f"Register a {reg.num_shards:,}-shard plan (1e9 records, 100 epochs, shuffled): "
        f"{register_s * 1e3:.1f} ms; master RSS {rss0 / 2**20:.0f} MB before, "
        f"{rss1 / 2**20:.0f} MB after (+{(rss1 - rss0) / 2**20:.1f} MB), "
        f"{rss2 / 2**20:.0f} MB after the load runs.",
    ]
    write_table(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
