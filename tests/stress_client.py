"""A pulling trainer process for the stress test (run as a script).

Each thread is one worker task (even task indexes use unary calls, odd ones a
ShardStream). Before every report it logs ``SENT epoch start n``;
after the master accepted it, ``ACK epoch start n`` — so a process killed in between
leaves a SENT without ACK, which the test treats as "maybe counted".
"""

import os
import random
import sys
import threading
import time

from antdt_tf import errors
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.client import ShardingClient, Task


def trainer(address, task, log_path, seconds_per_shard, seed):
    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(kind, epoch, start, n):
        os.write(fd, f"{kind} {epoch} {start} {n}\n".encode())

    with ShardingClient(address, task, timeout=60) as client:
        # even tasks use the unary calls, odd ones a ShardStream session
        c = client if task.index % 2 == 0 else client.stream(task)
        resp = c.get_shard("train")
        while resp.status != pb.GetShardResponse.END:
            if resp.status == pb.GetShardResponse.WAIT:
                time.sleep(resp.retry_after_seconds)
                resp = c.get_shard("train")
                continue
            s = resp.shard
            try:
                start = s.start
                half = s.length // 2
                time.sleep(seconds_per_shard / 2)
                if half and rng.random() < 0.5:
                    log("SENT", s.epoch, s.start, half)
                    c.report_progress(s, half)
                    log("ACK", s.epoch, s.start, half)
                    start += half
                time.sleep(seconds_per_shard / 2)
                log("SENT", s.epoch, start, s.start + s.length - start)
                r = c.report_done(s, get_next=True)
                log("ACK", s.epoch, start, s.start + s.length - start)
                resp = r.next
            except (errors.LeaseNotHeld, errors.StaleIncarnation):
                # our lease was taken away (we were declared dead): nothing counted
                resp = c.get_shard("train")


def main():
    address, log_dir, proc, inc, threads, seconds = sys.argv[1:7]
    proc, inc, threads, seconds = int(proc), int(inc), int(threads), float(seconds)
    workers = []
    for t in range(threads):
        task = Task("worker", proc * threads + t, inc)
        path = os.path.join(log_dir, f"p{proc}-t{t}-i{inc}.log")
        workers.append(threading.Thread(target=trainer, args=(
            address, task, path, seconds, hash((proc, t, inc)))))
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
