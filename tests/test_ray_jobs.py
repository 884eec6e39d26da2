"""Whole jobs on a real Ray cluster: three nodes, one raylet each (tests/raycluster.py),
``antdt-launch --backend=ray`` starting the master as an actor on the head node, every
PS, worker and chief an actor pinned to a node. The audit on the PS proves every record
was applied exactly once — through a master SIGKILLed and restarted, a persistent
straggler moved to another node, a slow PS replaced on another node, the loss of a
whole node (its raylet and every process on it), and a scale-out onto a node added
mid-job. Every trigger is the job's progress (the master's count of records), never
wall-clock time."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

import jobs
import raycluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The cluster, and the job's token and TLS files in the environment: the launcher
    uses them for the whole job, and this test's clients reach the master with them."""
    import netns

    netns.job_security(tmp_path / "tls", monkeypatch.setenv)
    with raycluster.RayTestCluster(3) as c:
        yield c


def launch(cluster, tmp_path, *flags, records: int):
    cmd = [LAUNCH_BIN, "--backend=ray", f"--ray_address={cluster.address}",
           f"--generate_records={records}", "--eval_records=2000", "--records_per_shard=1024",
           "--batch_size=128", "--buckets=4096", "--audit", "--checkpoint_every_seconds=2",
           "--straggler_window_seconds=3", "--straggler_persistent_after_seconds=2",
           "--min_gain_seconds=0.5", f"--workdir={tmp_path / 'job'}",
           f"--report_json={tmp_path / 'report.json'}", "--timeout_seconds=400", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def master_address(tmp_path, proc) -> str:
    port_file = tmp_path / "job" / "master.port"
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, "no master"
        time.sleep(0.1)
    return f"127.0.0.1:{int(port_file.read_text())}"


def finish(proc, tmp_path):
    out, _ = proc.communicate(timeout=450)
    assert proc.returncode == 0, out[-6000:]
    return json.loads((tmp_path / "report.json").read_text()), out


def exact(report) -> None:
    assert report["audit"]["applied_1"] == report["records"], report["audit"]


def test_a_job_trains_on_three_nodes_exactly_once_through_a_master_restart(cluster,
                                                                           tmp_path):
    """The master (an actor's child on the head node) is SIGKILLed at 30 % and started
    again by the launcher on its state dir: it adopts the task actors, launches nothing
    twice, and every record is applied once."""
    proc = launch(cluster, tmp_path, "--num_ps=2", "--num_workers=2", "--policy=dynamic",
                  "--inject=kill:master@30%", records=150_000)
    report, out = finish(proc, tmp_path)
    assert report["backend"] == "ray" and report["num_hosts"] == 3
    assert set(report["hosts"].values()) == {"h0", "h1", "h2"}, report["hosts"]
    assert report["restarts"] == {"master:0": 1}, (report["restarts"], report["events"])
    assert report["master_recoveries"] == 1
    exact(report)
    assert 0.5 < report["auc"] < 1.0
    assert "3 host(s) registered: h0 (127.0.0.1), h1 (127.0.0.1), h2 (127.0.0.1)" in out
    assert "records/s" in out             # the progress line, as on the local backend


def test_losing_a_node_brings_its_tasks_back_on_the_others_exactly_once(cluster, tmp_path):
    """Node h1 (its raylet and every process on it: the actors of ps:1 and worker:2 and
    their TF tasks) dies at a third of the job; Ray declares its actors dead with the
    node, the master relaunches them on h0/h2 (new addresses: the chief restarts with
    the new cluster and restores)."""
    records = 300_000
    proc = launch(cluster, tmp_path, "--num_ps=2", "--num_workers=3", "--policy=dynamic",
                  records=records)
    try:
        jobs.wait_for_records(master_address(tmp_path, proc), proc, records // 3)
        cluster.lose("h1")
    except BaseException:
        proc.kill()
        raise
    report, out = finish(proc, tmp_path)
    assert "h1" not in report["hosts"].values(), report["hosts"]
    lost = {ev["task"] for ev in report["failures"] if "host lost" in ev.get("failure", "")}
    assert lost == {"ps:1", "worker:2"}, report["failures"]
    assert report["restarts"]["ps:1"] == report["restarts"]["worker:2"] == 1
    assert report["coordinator"]["restored_from"]
    exact(report)


def test_the_job_goes_on_without_the_launcher(cluster, tmp_path):
    """The launcher (a Ray driver) is SIGKILLed at a third: the master actor, detached,
    runs the job to its end and writes the report; its idle actor is then removed as
    docs/ray.md says."""
    import ray

    records = 150_000
    proc = launch(cluster, tmp_path, "--num_ps=1", "--num_workers=2", "--policy=dynamic",
                  records=records)
    try:
        jobs.wait_for_records(master_address(tmp_path, proc), proc, records // 3)
    finally:
        proc.kill()                      # the launcher we started
        proc.communicate()
    report_path = tmp_path / "job" / "report.json"
    deadline = time.monotonic() + 300
    while not report_path.exists():
        assert time.monotonic() < deadline, "the master never wrote the report"
        time.sleep(0.5)
    report = json.loads(report_path.read_text())     # written whole (os.replace)
    exact(report)
    from antdt_tf.job.spec import default_namespace

    ray.init(address=cluster.address, namespace=default_namespace(tmp_path / "job"))
    master = ray.get_actor("master")
    deadline = time.monotonic() + 30       # the job's end released its task actors
    while [n for n in ray.util.list_named_actors() if n.startswith("antdt:")]:
        assert time.monotonic() < deadline, ray.util.list_named_actors()
        time.sleep(0.2)
    ray.kill(master)


@pytest.mark.parametrize("flags, action, task", [
    (("--num_ps=1", "--relaunch_cost_seconds=1", "--inject=slow:worker:1:x4@0s"),
     "RelaunchWorker", ("worker", 1)),
    (("--num_ps=2", "--replace_ps_cost_seconds=1", "--inject=slow:ps:0:x3@0s"),
     "ReplacePs", ("ps", 0)),
], ids=["persistent-worker-straggler", "slow-ps"])
def test_antdt_nd_moves_a_straggler_to_another_node_exactly_once(cluster, tmp_path, flags,
                                                                 action, task):
    """A persistent worker straggler is relaunched, a slow PS replaced, on another node
    (a new address: the chief restarts with the new cluster and restores)."""
    proc = launch(cluster, tmp_path, "--num_workers=2", "--policy=antdt-nd", *flags,
                  records=400_000 if task[0] == "worker" else 300_000)
    report, out = finish(proc, tmp_path)
    acts = [a for a in report["actions"] if a["action"] == action]
    assert len(acts) == 1, (report["actions"], report["health"], report["events"])
    act = acts[0]
    assert (act["job"], act["index"]) == task and act["from_host"] != act["to_host"]
    assert "recovered_after_s" in act
    assert report["restarts"].get("chief:0", 0) >= 1 and report["coordinator"]["restored_from"]
    exact(report)


def test_a_node_added_mid_job_gets_a_worker(cluster, tmp_path):
    """With a worker slot to spare (--max_workers), a node that joins the cluster mid-job
    (what Ray's autoscaler does) is the job's: it scales out onto it. The data is not
    held meanwhile (a real scale-out must not pause training), so the job is long
    enough for a new node's actor and TF process to start."""
    records = 600_000
    proc = launch(cluster, tmp_path, "--num_ps=1", "--num_workers=2", "--max_workers=3",
                  "--policy=dynamic", records=records)
    try:
        jobs.wait_for_records(master_address(tmp_path, proc), proc, records // 10)
        cluster.add("h3")
    except BaseException:
        proc.kill()
        raise
    report, out = finish(proc, tmp_path)
    scale = [a for a in report["actions"] if a["action"] == "ScaleWorkers"]
    assert len(scale) == 1 and "h3 joined" in scale[0]["reason"], report["actions"]
    assert report["hosts"]["worker:2"] == "h3", report["hosts"]
    assert report["master_records_per_task"].get("worker:2", 0) > 0
    exact(report)


def test_a_users_own_program_on_ray_survives_a_worker_kill(cluster, tmp_path):
    """A user's custom-loop program (tests/user_programs.py: own model, step, TFRecord
    data, per-record counter) from a directory every node sees, on three raylets,
    through a worker SIGKILL: exact by the user's own count."""
    import user_programs

    data = tmp_path / "data"
    data.mkdir()
    for k in range(2):
        user_programs.write_examples(data / f"part-{k}.tfrecord", 5000 * k, 5000, seed=k)
    program = user_programs.write_program(tmp_path / "my-project", "custom_loop")
    cmd = [LAUNCH_BIN, "--backend=ray", f"--ray_address={cluster.address}",
           f"--program={program}", f"--data={data}/*.tfrecord", "--records_per_shard=500",
           "--epochs=3", "--num_ps=1", "--num_workers=2", "--checkpoint_every_seconds=2",
           "--inject=kill:worker:1@40%", f"--workdir={tmp_path / 'job'}",
           f"--report_json={tmp_path / 'report.json'}", "--timeout_seconds=400",
           "--", "--batch_size=64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    report, out = finish(proc, tmp_path)
    assert report["backend"] == "ray" and report["records"] == 30_000
    assert report["restarts"].get("worker:1") == 1, report["restarts"]
    audit = report["audit"]
    assert audit["expected_times"] == 3 and audit["applied_0"] == 0 and audit["ok"], audit
