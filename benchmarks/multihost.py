"""Jobs across real hosts: what losing a host and moving a task cost, and scenario 2 on
the agents backend beside the local one, in one run.

Usage (as root: the hosts are network namespaces)::

    python -m benchmarks.multihost [--records=600000] [--loss_records=600000]
        [--move_records=1200000] [--backends=local,agents]
        [--out=benchmarks/results/multihost.md] [--smoke]

``--smoke``: the agents backend only (host loss, scenario 2's two policies, a move: four
jobs) on few records: checks that the benchmark runs; not a measurement.

Hosts: three network namespaces with their own addresses in 198.18.0.0/24 (our own test
hosts, ``tests/netns.py``), an ``antdt-agent`` on each registered with a master on the
bridge address, the job token on every call; ``antdt-launch --backend=agents`` places
the tasks. A fresh master and agents per job.

1. **Host loss**: 2 PS + 2 workers; at a third of the records every process of host h0
   (its agent, the chief, ps:0 and worker:1) is SIGKILLed at once. Measured from the
   master: the time from the kill to the master counting new records again (the chief
   restored the last checkpoint, so the count first drops back to it), the records
   trained again since that checkpoint, and the audit (every record once).
2. **Scenario 2** (persistent worker straggler, worker 2 at 1/4 speed from 3 s, 1 PS + 3
   workers), ``static`` vs ``antdt-nd``, on the local backend (simulated hosts on
   loopback: a moved worker keeps its address, TF re-joins it) and on the agents
   backend (a moved worker gets another host's address: the chief restarts with the
   new cluster and restores).
3. **A move**: the same straggler from the start, with the cost model primed to act
   (relaunch estimate 1 s, any gain worth it) and a short Monitor horizon, so AntDT-ND
   moves worker 2 to another host on both backends. Its cost: the new task's start-up
   beside the old one (``standby_seconds``), then from the old one killed to the new one
   training (``recovered_after_s``: on agents this includes the chief's restart and
   restore).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import netns  # noqa: E402  (the namespace hosts the tests use)

from benchmarks.jobs import (MONITOR, SCENARIO2, launch, report,  # noqa: E402
                            recovery_rows, scenario2_table, time_to_resume,
                            wait_for_records)
from benchmarks.results_table import absl_smoke, smoke_argv, write_table  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("records", 600_000, "Training records of the scenario-2 jobs.")
flags.DEFINE_integer("loss_records", 600_000, "Training records of the host-loss job.")
flags.DEFINE_integer("move_records", 1_200_000, "Training records of the move jobs (long "
                     "enough for the moved worker to train again before the end).")
flags.DEFINE_string("out", "benchmarks/results/multihost.md", "Results table (markdown).")
flags.DEFINE_list("backends", ["local", "agents"], "Backends of the scenario-2 and move "
                  "jobs, of local and agents (the host loss runs on agents).")
flags.register_validator("backends", lambda v: set(v) <= {"local", "agents"},
                         "--backends: local and/or agents")
# --smoke: every job kind on the agents backend, short jobs (the host loss long enough to
# kill a host a third of the way through and train again)
SMOKE = {"backends": "agents", "records": 20_000, "loss_records": 60_000,
         "move_records": 20_000}
absl_smoke(flags, SMOKE)

def scenario2(tmp: pathlib.Path, data: str, backend: str, policy: str) -> dict:
    workdir = tmp / f"s2-{backend}-{policy}"
    common = [*SCENARIO2, f"--policy={policy}"]
    if backend == "local":
        return report(launch(workdir, data, *common), workdir)
    with netns.NetnsHosts(3) as net:
        master = netns.start_antdt_cluster(net, tmp / f"cluster-{backend}-{policy}", *MONITOR,
                                              job_root=tmp)
        return report(launch(workdir, data, "--backend=agents", f"--master={master}",
                               "--num_hosts=3", *common), workdir)


def move(tmp: pathlib.Path, data: str, backend: str) -> dict:
    """Scenario 2's straggler from the start, with the cost model primed to act."""
    workdir = tmp / f"move-{backend}"
    monitor = ("--straggler_window_seconds=3", "--straggler_persistent_after_seconds=2")
    common = ["--num_ps=1", "--num_workers=3", "--policy=antdt-nd", *monitor,
              "--relaunch_cost_seconds=1", "--min_gain_seconds=0.5",
              "--inject=slow:worker:2:x4@0s"]
    if backend == "local":
        return report(launch(workdir, data, *common), workdir)
    with netns.NetnsHosts(3) as net:
        master = netns.start_antdt_cluster(net, tmp / f"cluster-move-{backend}", *monitor,
                                              job_root=tmp)
        return report(launch(workdir, data, "--backend=agents", f"--master={master}",
                               "--num_hosts=3", *common), workdir)


def host_loss(tmp: pathlib.Path, data: str, records: int) -> dict:
    from antdt_tf.sharding.client import ShardingClient

    workdir = tmp / "loss"
    with netns.NetnsHosts(3) as net:
        master = netns.start_antdt_cluster(net, tmp / "cluster-loss", job_root=tmp)
        proc = launch(workdir, data, "--backend=agents", f"--master={master}",
                       "--num_hosts=3", "--num_ps=2", "--num_workers=2", "--policy=dynamic",
                       "--host_timeout_seconds=3")
        with ShardingClient(master, timeout=10) as admin:
            killed_at, at_kill = wait_for_records(admin, proc, records // 3)
            net.kill_host(0)
            resumed = time_to_resume(admin, proc, at_kill, killed_at)
        rep = report(proc, workdir)
    return {"report": rep, "at_kill": at_kill, **resumed}


def main(argv):
    del argv
    ok, why = netns.available()
    if not ok:
        raise app.UsageError(f"this benchmark needs network namespaces: {why}")
    from antdt_tf.launcher.generate import generate_data

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="antdt-multihost-"))
    netns.job_security(tmp / "tls", os.environ.__setitem__)
    data, _ = generate_data(tmp, max(FLAGS.records, FLAGS.loss_records), 0, seed=1)
    move_data, _ = generate_data(tmp / "move", FLAGS.move_records, 0, seed=2)
    rows = {}
    loss = host_loss(tmp, data, FLAGS.loss_records)
    print(f"host loss: training again after {loss['training_again_after_s']}", flush=True)
    for backend in FLAGS.backends:
        for policy in ("static", "antdt-nd"):
            rows[backend, policy] = scenario2(tmp, data, backend, policy)
            print(backend, policy, rows[backend, policy]["jct_seconds"], flush=True)

    moves = {backend: move(tmp, move_data, backend) for backend in FLAGS.backends}
    for backend, rep in moves.items():
        print("move", backend, rep["jct_seconds"], rep["actions"], flush=True)

    r = loss["report"]
    lines = [f"# Multi-host runs ({time.strftime('%Y-%m-%d')}, `python -m benchmarks.multihost`)",
             "", "Three network-namespace hosts (198.18.0.0/24), one agent each, the master on "
             "the bridge address, job token on; one round (this machine's speed drifts "
             "±20 % between runs); job sizes in the module docstring.", "",
             "## Losing a host", "",
             "| what | value |", "|---|---|",
             f"| records | {r['records']:,} (2 PS + 2 workers, h0 = chief + ps:0 + worker:1) |",
             f"| killed at | {loss['at_kill']:,} records done |",
             f"| kill -> training again (the count grows after the restore) | "
             f"{loss['training_again_after_s']:.1f} s |" if loss["training_again_after_s"] else
             "| kill -> training again (the count grows after the restore) | (not seen) |",
             *recovery_rows(loss), "",
             "## Scenario 2 (persistent worker straggler) per backend", ""]
    lines += scenario2_table(rows, FLAGS.backends)
    lines += ["", "## What a move costs", "",
              "| backend | action | start-up beside the old one (s) | old killed -> new trains (s) "
              "| JCT (s) | audit exact |", "|---|---|---|---|---|---|"]
    # records: FLAGS.move_records; the phase shows whether the moved worker trained again
    for backend, rep in moves.items():
        acts = [a for a in rep["actions"] if a["action"] == "RelaunchWorker"] or [{}]
        a = acts[0]
        what = (f"RelaunchWorker worker:{a['index']} host{a['from_host']} -> host{a['to_host']}"
                if a else "no move (the policy did not act)")
        exact = rep["audit"]["applied_1"] == rep["records"]
        lines.append(f"| {backend} | {what} | {a.get('standby_seconds', '-')} | "
                     f"{a.get('recovered_after_s', '-')} | {rep['jct_seconds']:.1f} | "
                     f"{'yes' if exact else 'NO'} |")
    write_table(FLAGS.out, lines, smoke=FLAGS.smoke)


if __name__ == "__main__":
    app.run(main, argv=smoke_argv(sys.argv, SMOKE))
