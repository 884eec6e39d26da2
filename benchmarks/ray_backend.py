"""Jobs on a real Ray cluster: what losing a node costs, and scenario 2 on the Ray
backend beside the local one, in one run.

Usage::

    python -m benchmarks.ray_backend [--records=600000] [--loss_records=600000]
        [--backends=local,ray] [--out=benchmarks/results/ray.md] [--smoke]

``--smoke``: the Ray backend only (node loss, scenario 2's two policies: three jobs) on
few records: checks that the benchmark runs; not a measurement.

Cluster: three Ray nodes on this machine, one raylet each (``ray.cluster_utils``, the
tests' settings: 127.0.0.1, token authentication, no dashboard, a dead node declared
dead after ~2 s of missed health checks; ``tests/raycluster.py``), a fresh cluster per
job; ``antdt-launch --backend=ray`` runs the master as an actor on the head node and
every task as an actor pinned to a node.

1. **Node loss**: 2 PS + 3 workers; at a third of the records node h1 is removed (its
   raylet and every process on it die at once: ps:1 and worker:2 with their actors). Measured from the master: the time from
   the removal to the master counting new records again (the chief restored the last
   checkpoint, so the count first drops back to it), the records trained again since
   that checkpoint, and the audit (every record once). Goal: under 30 s.
2. **Scenario 2** (persistent worker straggler, worker 2 at 1/4 speed from 3 s, 1 PS + 3
   workers), ``static`` vs ``antdt-nd``, on the local backend (simulated hosts on
   loopback: a moved worker keeps its address) and on the Ray backend (a moved worker's
   actor goes to another node at another address: the chief restarts with the new
   cluster and restores).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import raycluster  # noqa: E402
raycluster.set_session_env()         # Ray's settings, before anything imports Ray
import netns  # noqa: E402  (the job's token and TLS files)

from absl import app, flags  # noqa: E402

from benchmarks.jobs import (SCENARIO2, launch, report,  # noqa: E402
                            recovery_rows, scenario2_table, time_to_resume,
                            wait_for_records)
from benchmarks.results_table import absl_smoke, smoke_argv, write_table  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("records", 600_000, "Training records of the scenario-2 jobs.")
flags.DEFINE_integer("loss_records", 600_000, "Training records of the node-loss job.")
flags.DEFINE_string("out", "benchmarks/results/ray.md", "Results table (markdown).")
flags.DEFINE_list("backends", ["local", "ray"], "Backends of the scenario-2 jobs, of local "
                  "and ray (the node loss runs on ray).")
flags.register_validator("backends", lambda v: set(v) <= {"local", "ray"},
                         "--backends: local and/or ray")
# --smoke: every job kind on the Ray backend, short jobs (the node loss long enough to
# remove a node a third of the way through and train again)
SMOKE = {"backends": "ray", "records": 20_000, "loss_records": 60_000}
absl_smoke(flags, SMOKE)

def _master(workdir: pathlib.Path, proc) -> str:
    port = workdir / "master.port"
    while not (port.exists() and port.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError("the launcher ended before its master served")
        time.sleep(0.1)
    return f"127.0.0.1:{int(port.read_text())}"


def scenario2(tmp: pathlib.Path, data: str, backend: str, policy: str) -> dict:
    workdir = tmp / f"s2-{backend}-{policy}"
    common = [*SCENARIO2, f"--policy={policy}"]
    if backend == "local":
        return report(launch(workdir, data, *common), workdir)
    with raycluster.RayTestCluster(3) as cluster:
        return report(launch(workdir, data, "--backend=ray",
                               f"--ray_address={cluster.address}", *common), workdir)


def node_loss(tmp: pathlib.Path, data: str, records: int) -> dict:
    from antdt_tf.sharding.client import ShardingClient

    workdir = tmp / "loss"
    with raycluster.RayTestCluster(3) as cluster:
        proc = launch(workdir, data, "--backend=ray", f"--ray_address={cluster.address}",
                       "--num_ps=2", "--num_workers=3", "--policy=dynamic")
        with ShardingClient(_master(workdir, proc), timeout=10) as admin:
            lost_at, at_loss = wait_for_records(admin, proc, records // 3)
            cluster.lose("h1")
            resumed = time_to_resume(admin, proc, at_loss, lost_at)
        rep = report(proc, workdir)
    on_lost = sorted(ev["task"] for ev in rep["failures"]
                     if "host lost" in ev.get("failure", ""))
    return {"report": rep, "at_loss": at_loss, "on_lost": on_lost, **resumed}


def main(argv):
    del argv
    from antdt_tf.launcher.generate import generate_data

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="antdt-ray-bench-"))
    netns.job_security(tmp / "tls", os.environ.__setitem__)
    data, _ = generate_data(tmp, max(FLAGS.records, FLAGS.loss_records), 0, seed=1)
    loss = node_loss(tmp, data, FLAGS.loss_records)
    print(f"node loss: training again after {loss['training_again_after_s']}", flush=True)
    rows = {}
    for backend in FLAGS.backends:
        for policy in ("static", "antdt-nd"):
            rows[backend, policy] = scenario2(tmp, data, backend, policy)
            print(backend, policy, rows[backend, policy]["jct_seconds"], flush=True)

    r = loss["report"]
    resumed = (f"{loss['training_again_after_s']:.1f} s" if loss["training_again_after_s"] is not None
               else "(not seen)")
    lines = [f"# Ray backend runs ({time.strftime('%Y-%m-%d')}, "
             "`python -m benchmarks.ray_backend`)", "",
             "Three Ray nodes on this machine (one raylet each, 127.0.0.1, token auth, no "
             "dashboard, health checks every 0.5 s: a node is declared dead after ~2 s), "
             "a fresh cluster per job; 2 cores shared by every node and task; one round "
             "(this machine's speed drifts ±20 % between runs); job sizes in the module "
             "docstring.", "",
             "## Losing a node", "",
             "| what | value |", "|---|---|",
             f"| records | {r['records']:,} (2 PS + 3 workers on h0, h1, h2) |",
             f"| node h1 removed at | {loss['at_loss']:,} records done |",
             f"| its tasks (declared host lost) | {', '.join(loss['on_lost']) or '-'} |",
             f"| removal -> training again (the count grows after the restore) | {resumed} |",
             *recovery_rows(loss), "",
             "## Scenario 2 (persistent worker straggler) per backend", ""]
    lines += scenario2_table(rows, FLAGS.backends)
    write_table(FLAGS.out, lines, smoke=FLAGS.smoke)


if __name__ == "__main__":
    app.run(main, argv=smoke_argv(sys.argv, SMOKE))
