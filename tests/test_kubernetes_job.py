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
import procs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")
NS = "antdt-job-test"


def test_a_killed_worker_pod_comes_back_under_its_name_losing_nothing(tmp_path):
    import kubefake

    ok, why = kubefake.pod_dns_available()
    if not ok:
        pytest.skip(why)
    records = 120_000
    data, held_out = jobs.write_data(tmp_path, records, 2000, seed=7)
    with kubefake.FakeCluster(nodes=["n0", "n1", "n2"], pod_dns=True) as fake:
        master = procs.MasterProcess(tmp_path / "master", state_dir=tmp_path / "master" / "state",
                                     flags=[f"--kubernetes_image=antdt-tf:test",
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
                 "--checkpoint_every_seconds=2", "--policy=dynamic",
                 f"--report_json={tmp_path / 'report.json'}", "--timeout_seconds=400"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                jobs.wait_for_records(master.address, proc, records // 3)
                pod = "antdt-e2e-worker-1-g1"
                assert fake.container_pid(NS, pod), [p["metadata"]["name"]
                                                     for p in fake.objects("pods")]
                fake.kill_container(NS, pod, 9)          # a fault: its process, SIGKILL
                out, _ = proc.communicate(timeout=450)
            except BaseException:
                proc.kill()
                raise
            assert proc.returncode == 0, out[-6000:] + master.output()[-4000:]
            report = json.loads((tmp_path / "report.json").read_text())
            # the job's end deleted its ConfigMap, and the garbage collector its pods
            jobs.wait_until(lambda: not fake.objects("pods"), 60, "the job's pods to go")
        finally:
            master.stop()
    audit = report["audit"]
    assert audit["ok"] and audit["applied_0"] == 0, audit
    assert audit["applied_other"] <= 128 == audit["allowed_off_records"], audit
    assert report["restarts"].get("worker:1") == 1, (report["restarts"], report["events"])
    assert report["restarts"].get("chief:0", 0) == 0, report["events"]   # the same name
    failed = [f for f in report["failures"] if f["task"] == "worker:1"]
    assert [f["failure"] for f in failed] == ["signal SIGKILL"], report["failures"]
    assert "pods of the master at" in out and "records/s" in out
