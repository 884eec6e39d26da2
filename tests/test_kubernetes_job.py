"""A whole job on Kubernetes pods — of the fake cluster (``tests/kubefake``: the
unmodified ``kubernetes`` client against a stateful fake API server whose kubelet runs
every pod as a real process, and whose cluster DNS resolves every headless Service to
its ready pod in the pods' own ``/etc/hosts``).

``antdt-master --kubernetes_*`` takes a job from ``antdt-launch --backend=kubernetes``
and creates the PS, worker and chief pods itself; the test SIGKILLs a worker's container
at a third of the job (a trigger on the master's count of records, not on time); the
master sees the pod fail, launches the worker's next generation as a new pod under the
same Service name, and the chief, whose cluster names the worker by that name, goes on
without a restart. The audit on the PS proves no record was lost and none applied twice
beyond the one batch that may be in flight when a worker dies (docs/data.md#exactness).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import jobs
from waiting import wait_for
import procs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")
NS = "antdt-job-test"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_job(tmp_path, fault, records: int = 120_000, policy: str = "dynamic",
            at: float = 1 / 3, flags=()):
    """A job on the fake cluster; ``fault(fake, master)`` runs when the master counts
    ``at`` of the records done. Returns the report and the launcher's output."""
    import kubefake

    ok, why = kubefake.pod_dns_available()
    if not ok:
        pytest.skip(why)
    data, held_out = jobs.write_data(tmp_path, records, 2000, seed=7)
    with kubefake.FakeCluster(nodes=["n0", "n1", "n2"], pod_dns=True) as fake:
        # a fixed port: a restarted master serves where its tasks and the launcher call
        master = procs.MasterProcess(tmp_path / "master", state_dir=tmp_path / "master" / "state",
                                     port=_free_port(),
                                     flags=["--kubernetes_image=antdt-tf:test",
                                            f"--kubernetes_namespace={NS}",
                                            "--kubernetes_job=e2e",
                                            f"--kubernetes_kubeconfig={fake.kubeconfig_path}",
                                            f"--kubernetes_mount_path={tmp_path}",
                                            "--kubernetes_distinct_ports"]).start()
        try:
            proc = subprocess.Popen(
                [LAUNCH_BIN, "--backend=kubernetes", f"--master={master.address}",
                 f"--data={data}", f"--eval_data={held_out}", f"--workdir={tmp_path / 'job'}",
                 "--num_ps=1", "--num_workers=2", "--records_per_shard=1024",
                 "--batch_size=128", "--buckets=4096", "--audit",
                 "--checkpoint_every_seconds=2", f"--policy={policy}",
                 f"--report_json={tmp_path / 'report.json'}", "--timeout_seconds=400",
                 *flags],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                jobs.wait_for_records(master.address, proc, int(records * at))
                fault(fake, master)
                out, _ = proc.communicate(timeout=450)
            except BaseException:
                proc.kill()
                raise
            assert proc.returncode == 0, out[-6000:] + master.output()[-4000:]
            report = json.loads((tmp_path / "report.json").read_text())
            # the job's end deleted its ConfigMap, and the garbage collector its pods
            wait_for(lambda: not fake.objects("pods"), 60, "the job's pods to go")
        finally:
            master.stop()
    return report, out


def test_a_killed_worker_pod_comes_back_under_its_name_losing_nothing(tmp_path):
    def kill_worker(fake, master):
        pod = "antdt-e2e-worker-1-g1"
        assert fake.container_pid(NS, pod), [p["metadata"]["name"]
                                             for p in fake.objects("pods")]
        fake.kill_container(NS, pod, 9)          # a fault: its process, SIGKILL
    report, out = run_job(tmp_path, kill_worker)
    audit = report["audit"]
    assert audit["ok"] and audit["applied_0"] == 0, audit
    assert audit["applied_other"] <= 128 == audit["allowed_off_records"], audit
    assert report["restarts"].get("worker:1") == 1, (report["restarts"], report["events"])
    assert report["restarts"].get("chief:0", 0) == 0, report["events"]   # the same name
    failed = [f for f in report["failures"] if f["task"] == "worker:1"]
    assert [f["failure"] for f in failed] == ["signal SIGKILL"], report["failures"]
    assert "pods of the master at" in out and "records/s" in out


def test_a_master_restarted_on_its_state_adopts_the_pods_that_run(tmp_path):
    """What a rescheduled master pod does (its state dir on the claim): the master is
    SIGKILLed at a third and started again on the same state dir and address; it lists
    the job's pods, launches none of them again, and the job finishes exactly once."""
    def restart_master(fake, master):
        before = sorted(p["metadata"]["name"] for p in fake.objects("pods"))
        master.kill()
        master.start()
        assert sorted(p["metadata"]["name"] for p in fake.objects("pods")) == before
    report, out = run_job(tmp_path, restart_master)
    assert report["master_recoveries"] == 1, report["events"]
    assert not {k: n for k, n in report["restarts"].items() if n}, report["restarts"]
    assert report["audit"]["applied_1"] == report["records"], report["audit"]


def test_a_straggler_on_a_busy_node_moves_to_another_under_its_name(tmp_path):
    """AntDT-ND on a non-dedicated cluster: worker:1's node n2 gets a busy neighbour as
    training starts (its containers run at 1/4). The Monitor finds a persistent
    straggler; the Controller relaunches it on another node as a standby that takes
    over its address when the old pod is gone — on Kubernetes the same Service name, so
    the chief goes on without a restart (on Ray, a move restarts the chief)."""
    # busy from the first shard, and long enough for the moved worker to train again
    # before the end on a fast machine too (the Monitor's windows are wall-clock time)
    report, out = run_job(
        tmp_path, lambda fake, master: fake.slow_node("n2", 4.0), records=600_000,
        policy="antdt-nd", at=0.0,
        flags=("--relaunch_cost_seconds=1", "--straggler_window_seconds=3",
               "--straggler_persistent_after_seconds=2", "--min_gain_seconds=0.5"))
    acts = [a for a in report["actions"] if a["action"] == "RelaunchWorker"]
    assert len(acts) == 1, (report["actions"], report["health"], report["events"])
    act = acts[0]
    hosts = ["n0", "n1", "n2"]                 # host indices in the report
    assert (act["job"], act["index"], hosts[act["from_host"]]) == ("worker", 1, "n2"), act
    assert act["phase"] == "done" and "recovered_after_s" in act, act
    assert report["hosts"]["worker:1"] == hosts[act["to_host"]] != "n2"
    assert report["restarts"].get("chief:0", 0) == 0, report["events"]   # the same name
    audit = report["audit"]
    assert audit["ok"] and audit["applied_0"] == 0, audit
