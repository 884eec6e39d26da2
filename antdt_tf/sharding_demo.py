"""antdt-sharding-demo: dynamic data sharding with pulling clients of different speeds.

Starts a real ``antdt-master`` process (loopback, temporary state_dir), registers a
dataset and lets simulated trainers of different speeds pull shards from it. Fast
trainers end up with more shards: the split is printed at the end. (Real TensorFlow
training through the same service comes with the PSS integration.)

Usage: antdt-sharding-demo [--records=200000] [--records_per_shard=500]
       [--slowdowns=1,1,2,4] [--seconds_per_record=0.0001]
"""

from __future__ import annotations

import os
import pathlib
import signal
import tempfile
import threading
import time

from absl import app, flags
from tqdm import tqdm

from antdt_tf.procutil import start_master
from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.sharding.plan import DatasetSpec

FLAGS = flags.FLAGS
flags.DEFINE_integer("records", 200_000, "Records in the dataset.")
flags.DEFINE_integer("records_per_shard", 500, "Records per shard.")
flags.DEFINE_integer("epochs", 1, "Epochs.")
flags.DEFINE_list("slowdowns", ["1", "1", "2", "4"], "One simulated trainer per entry: how "
                  "many times slower than the fastest it is.")
flags.DEFINE_float("seconds_per_record", 0.0001, "Simulated cost of one record on the fastest "
                   "trainer.")


def _trainer(address: str, index: int, seconds_per_record: float, out: dict) -> None:
    with ShardingClient(address, Task("worker", index)) as client, client.stream() as stream:
        for shard in stream.shards("train"):
            time.sleep(shard.length * seconds_per_record)   # "training"
            out[index] = out.get(index, 0) + 1


def main(argv):
    del argv
    try:
        slowdowns = [float(s) for s in FLAGS.slowdowns]
    except ValueError as e:
        raise app.UsageError(f"--slowdowns must be numbers: {e}") from e
    if not slowdowns or min(slowdowns) < 1:
        raise app.UsageError("--slowdowns needs one or more factors >= 1")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="antdt-demo-"))
    proc, address = start_master(workdir)
    print(f"antdt-master pid {proc.pid} serving on {address} (state in {workdir / 'state'})")
    try:
        with ShardingClient(address) as admin:
            spec = DatasetSpec("train", records_per_shard=FLAGS.records_per_shard,
                               num_records=FLAGS.records, num_epochs=FLAGS.epochs, shuffle=True)
            total = admin.register_dataset(spec).num_shards * FLAGS.epochs
            shards: dict[int, int] = {}
            threads = [threading.Thread(target=_trainer, daemon=True, args=(
                address, i, FLAGS.seconds_per_record * s, shards)) for i, s in enumerate(slowdowns)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            with tqdm(total=total, unit="shard", desc="train", dynamic_ncols=True) as bar:
                while any(t.is_alive() for t in threads):
                    time.sleep(0.2)
                    p = admin.progress("train").datasets[0]
                    done = p.epoch * p.shards_per_epoch + p.done_shards if not p.finished else total
                    bar.update(done - bar.n)
                    bar.set_postfix(records_s=f"{p.records_done_total / (time.monotonic() - t0):,.0f}",
                                    epoch=min(p.epoch + 1, p.num_epochs))
            elapsed = time.monotonic() - t0
            final = admin.progress("train")
        print(f"\nfinished {final.datasets[0].records_done_total:,} records in {elapsed:.1f}s")
        print(f"{'trainer':<10}{'slowdown':>9}{'shards':>8}{'share':>8}{'ideal':>8}")
        speed_sum = sum(1 / s for s in slowdowns)
        for i, s in enumerate(slowdowns):
            n = shards.get(i, 0)
            print(f"worker:{i:<3}{s:>8.1f}x{n:>8}{n / total:>8.1%}{(1 / s) / speed_sum:>8.1%}")
        work = FLAGS.records * FLAGS.epochs * FLAGS.seconds_per_record
        print(f"an equal static split would take ~{work / len(slowdowns) * max(slowdowns):.1f}s "
              f"(the slowest trainer's share); the ideal is ~{work / speed_sum:.1f}s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return 0


def run():
    from antdt_tf import exitcodes

    exitcodes.run(main, "antdt-sharding-demo")


if __name__ == "__main__":
    run()
