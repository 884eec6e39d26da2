"""Whole jobs across real hosts: three network namespaces with their own addresses in
198.18.0.0/24, an ``antdt-agent`` on each that registers with a real master on the
bridge address (every call authenticated with the job's token), and ``antdt-launch
--backend=agents`` submitting the job to that master, which places PS, workers and chief
on them. The audit on the PS proves
every record was applied exactly once — through a straggler moved to another host (a
new address: the chief restarts with the new cluster) and through the loss of a whole
host (every process of its namespace SIGKILLed at once, agent included)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

import netns
from jobs import wait_for_records

pytestmark = pytest.mark.slow
LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    netns.job_security(tmp_path / "tls", monkeypatch.setenv)
    with netns.NetnsHosts(3) as net:
        yield net, netns.start_antdt_cluster(net, tmp_path, "--straggler_window_seconds=3",
                                             "--straggler_persistent_after_seconds=2")


def launch_cmd(tmp_path, master, *flags, records):
    return [LAUNCH_BIN, "--backend=agents", f"--master={master}", "--num_hosts=3",
            f"--generate_records={records}", "--eval_records=2000", "--records_per_shard=1024",
            "--batch_size=128", "--buckets=4096", "--audit", "--host_timeout_seconds=3",
            "--checkpoint_every_seconds=2", f"--workdir={tmp_path / 'job'}",
            f"--report_json={tmp_path / 'report.json'}", "--timeout_seconds=400", *flags]


def finish(proc, tmp_path):
    out, _ = proc.communicate(timeout=450)
    assert proc.returncode == 0, out[-6000:]
    return json.loads((tmp_path / "report.json").read_text()), out


def test_a_job_trains_across_three_hosts_exactly_once(hosts, tmp_path):
    net, master = hosts
    proc = subprocess.Popen(launch_cmd(tmp_path, master, "--num_ps=2", "--num_workers=2",
                                       "--policy=dynamic", records=60_000),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    report, out = finish(proc, tmp_path)
    assert report["backend"] == "agents" and report["num_hosts"] == 3
    assert len(set(report["hosts"].values())) == 3, report["hosts"]   # spread over all
    assert report["audit"]["applied_1"] == report["records"] == 60_000, report["audit"]
    assert 0.5 < report["auc"] < 1.0
    assert "3 host(s) registered" in out


def test_losing_a_host_relaunches_its_tasks_elsewhere_exactly_once(hosts, tmp_path):
    """Host h0 runs the chief, ps:0 and worker:1: all of it SIGKILLed at once, agent
    included, at a third of the job. The master sees the host lost, relaunches its
    tasks on h1/h2 (new addresses), the chief restores the last checkpoint."""
    net, master = hosts
    records = 300_000
    proc = subprocess.Popen(launch_cmd(tmp_path, master, "--num_ps=2", "--num_workers=2",
                                       "--policy=dynamic", records=records),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_records(master, proc, records // 3)   # progress, not time
        lost = net.kill_host(0)
        assert len(lost) >= 4        # agent, chief, ps:0, worker:1
    except BaseException:
        proc.kill()
        raise
    report, out = finish(proc, tmp_path)
    assert "h0" not in report["hosts"].values(), report["hosts"]
    for task in ("chief:0", "ps:0", "worker:1"):
        assert report["restarts"].get(task, 0) >= 1, (task, report["restarts"])
    assert any("host lost" in ev.get("failure", "") for ev in report["failures"]), \
        report["failures"]
    assert report["coordinator"]["restored_from"]
    assert report["audit"]["applied_1"] == report["records"] == records, report["audit"]


def test_a_persistent_straggler_moves_to_another_host_exactly_once(hosts, tmp_path):
    """AntDT-ND relaunches the x4-slowed worker on another host: a new address, so the
    chief restarts with the new cluster and restores; every record still once."""
    net, master = hosts
    proc = subprocess.Popen(launch_cmd(tmp_path, master, "--num_ps=1", "--num_workers=2",
                                       "--policy=antdt-nd", "--relaunch_cost_seconds=1",
                                       "--min_gain_seconds=0.5",
                                       "--inject=slow:worker:1:x4@0s", records=400_000),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    report, out = finish(proc, tmp_path)
    moves = [a for a in report["actions"] if a["action"] == "RelaunchWorker"]
    assert len(moves) == 1, (report["actions"], report["health"], report["events"])
    act = moves[0]
    assert (act["job"], act["index"]) == ("worker", 1) and act["from_host"] != act["to_host"]
    assert "recovered_after_s" in act
    assert any("worker:1 moved to 198.18.0." in ev["event"] for ev in report["events"])
    assert report["restarts"].get("chief:0", 0) >= 1 and report["coordinator"]["restored_from"]
    assert report["audit"]["applied_1"] == report["records"], report["audit"]


def test_the_master_killed_and_restarted_mid_job_launches_nothing_twice(hosts, tmp_path):
    """The master, which runs the job, is SIGKILLed at a third of the records and started
    again on its state dir and port. Agents, workers and the chief wait for it; the new
    master resumes the job — it adopts the tasks that still run, restarts none — and
    every record is applied once."""
    net, master = hosts
    records = 200_000
    proc = subprocess.Popen(launch_cmd(tmp_path, master, "--num_ps=1", "--num_workers=2",
                                       "--policy=dynamic", records=records),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_records(master, proc, records // 3)
        old = net.procs[0]                       # the master, started first
        old.kill()
        old.wait()
        port = master.rsplit(":", 1)[1]
        with open(tmp_path / "cluster.log", "ab") as log:
            net.procs.append(subprocess.Popen(
                [sys.executable, "-m", "antdt_tf.master", f"--bind={netns.BRIDGE_ADDRESS}",
                 f"--port={port}", f"--state_dir={tmp_path / 'master'}"],
                stdout=log, stderr=log, start_new_session=True))
    except BaseException:
        proc.kill()
        raise
    report, out = finish(proc, tmp_path)
    assert report["restarts"] == {}, (report["restarts"], report["events"])
    assert report["master_recoveries"] == 1          # the master resumed the job itself
    assert report["audit"]["applied_1"] == report["records"] == records, report["audit"]


def test_the_job_goes_on_without_the_launcher(hosts, tmp_path):
    """The launcher only submits and follows: SIGKILLed at a third of the records, the
    job still runs to its end in the master, which writes the report."""
    from antdt_tf.launcher.follow import JobClient
    from antdt_tf.proto import job_pb2 as jpb

    net, master = hosts
    records = 150_000
    proc = subprocess.Popen(launch_cmd(tmp_path, master, "--num_ps=1", "--num_workers=2",
                                       "--policy=dynamic", records=records),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_records(master, proc, records // 3)
    finally:
        proc.kill()                  # the launcher we started
        proc.wait()
    client = JobClient(master, timeout=10)
    deadline = time.monotonic() + 300
    while (status := client.get()).state == jpb.JobStatus.RUNNING:
        assert time.monotonic() < deadline, [e.text for e in status.events]
        time.sleep(0.5)
    client.close()
    assert status.state == jpb.JobStatus.SUCCEEDED, status.message
    report = json.loads(pathlib.Path(status.report_path).read_text())
    assert report["audit"]["applied_1"] == report["records"] == records, report["audit"]
