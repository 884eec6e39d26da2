"""The Ray backend's perimeter on a real Ray cluster (tests/raycluster.py): nothing of
the cluster or of the job's tasks listens beyond loopback, a driver without the
cluster's token is refused, a task actor takes no environment but the job's secrets,
and bad ``--backend=ray`` flags are refused before anything starts."""

from __future__ import annotations

import ipaddress
import os
import pathlib
import subprocess
import sys
import time

import pytest

import raycluster
from antdt_tf.proto import cluster_pb2 as cpb

pytestmark = pytest.mark.slow
LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_ray_and_the_tasks_listen_on_loopback_only_and_a_wrong_token_is_refused(tmp_path):
    import psutil

    from antdt_tf.backends import TaskName, TaskSpec
    from antdt_tf.backends.ray import RayBackend

    with raycluster.RayTestCluster(2) as cluster:
        backend = RayBackend("antdt-perimeter", cluster.address, log_dir=str(tmp_path))
        endpoint = backend.endpoint("worker", 0, "h1")
        backend.launch(TaskSpec(TaskName("worker", 0), cpb.PROBE_TASK, cpb.ProbeTaskArgs(
            endpoint=endpoint, name="worker:0"), endpoint=endpoint), "h1")
        deadline = time.monotonic() + 20
        ours = cluster.pids() | {os.getpid()}
        listening = []
        while not any(c.laddr.port == int(endpoint.rsplit(":", 1)[1]) for c in listening):
            assert time.monotonic() < deadline, "the task never listened"
            time.sleep(0.2)
            listening = [c for c in psutil.net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN and c.pid in ours]
        assert len({c.pid for c in listening}) >= 4     # GCS, raylets, actors, the task
        beyond = [(psutil.Process(c.pid).name(), c.laddr) for c in listening
                  if not _loopback(c.laddr.ip)]
        assert beyond == [], beyond

        # Ray's own perimeter: a driver with another token does not join
        env = dict(os.environ, RAY_AUTH_TOKEN="0" * 32)
        joined = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address='{cluster.address}'); "
             "print('JOINED')"], env=env, capture_output=True, text=True, timeout=180)
        assert joined.returncode != 0 and "JOINED" not in joined.stdout
        assert "InvalidAuthToken" in joined.stderr
        backend.release_all()


def test_a_task_actor_takes_only_the_jobs_secrets(tmp_path):
    """What a task process runs with is the actor's environment: nothing a caller names
    beyond the job's token and TLS files reaches it (e.g. LD_PRELOAD, PYTHONPATH)."""
    import ray

    from antdt_tf.backends.ray import TaskActor, remote_class

    with raycluster.RayTestCluster(1) as cluster:
        ray.init(address=cluster.address, namespace="antdt-env")
        actor = remote_class(TaskActor).options(num_cpus=0, max_restarts=0).remote(
            {"ANTDT_JOB_TOKEN": "t", "LD_PRELOAD": "/tmp/evil.so"}, str(tmp_path), (), ())
        with pytest.raises(ray.exceptions.RayActorError) as e:
            ray.get(actor.status.remote(), timeout=60)
        assert "LD_PRELOAD" in str(e.value)


@pytest.mark.parametrize("flags, says", [
    (["--api=keras"], "--backend=ray runs --api=custom_loop"),
    (["--task_ports=24000-23000"], "--task_ports"),
    (["--task_ports=80-90"], "1024-65535"),
])
def test_bad_ray_flags_exit_2_before_anything_starts(tmp_path, flags, says):
    out = subprocess.run([LAUNCH_BIN, "--backend=ray", "--generate_records=1000",
                          f"--workdir={tmp_path / 'job'}", *flags],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert says in out.stderr
    assert not (tmp_path / "job").exists()


def test_ray_flags_without_the_ray_backend_exit_2(tmp_path):
    out = subprocess.run([LAUNCH_BIN, "--ray_namespace=x", "--generate_records=1000",
                          f"--workdir={tmp_path / 'job'}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "go with --backend=ray" in out.stderr


def test_no_ray_cluster_token_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    out = subprocess.run([LAUNCH_BIN, "--backend=ray", "--generate_records=1000",
                          f"--workdir={tmp_path / 'job'}"], capture_output=True, text=True,
                         timeout=120, env=dict(env, HOME=str(tmp_path)))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "RAY_AUTH_TOKEN" in out.stderr
