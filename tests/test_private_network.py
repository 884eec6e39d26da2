"""A local job's ports are unreachable from outside its private network namespace.

TensorFlow's servers listen on every interface and authenticate no one; a local job runs
them (and its master and agents) in a network namespace of its own. These tests start
real TF servers and a real job, and try to connect from outside."""

import os
import pathlib
import subprocess
import sys

import pytest

from antdt_tf import auth
from antdt_tf.backends import private_network
from antdt_tf.procutil import child_env
from antdt_tf.tf.local_cluster import free_ports
from procs import reachable
from waiting import wait_for

LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")


def reachable_inside(network, address: str) -> bool:
    host, port = address.rsplit(":", 1)
    probe = (f"import socket; socket.create_connection(({host!r}, {port}), timeout=2)")
    return subprocess.run(network.command([sys.executable, "-c", probe]),
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", ["netns", "userns"])
def test_a_tf_server_in_the_private_network_is_unreachable_from_outside(kind, tmp_path):
    network, why = private_network.create(prefer=kind)
    if network is None:
        pytest.skip(why)
    ps, worker = free_ports(2)
    spec = f'{{"ps": ["127.0.0.1:{ps}"], "worker": ["127.0.0.1:{worker}"]}}'
    with network, open(tmp_path / "ps.log", "wb") as log:
        proc = subprocess.Popen(network.command(
            [sys.executable, "-m", "antdt_tf.tf.server", f"--cluster={spec}", "--job=ps",
             "--index=0"]), stdout=log, stderr=log, env=child_env(), start_new_session=True)
        try:
            # it serves (seen from inside the namespace) ...
            wait_for(lambda: reachable_inside(network, f"127.0.0.1:{ps}"), 120,
                     "the TF server to listen", interval=0.2)   # each look starts a process
            # ... on every interface of its namespace, and nothing outside reaches it
            assert not reachable(f"127.0.0.1:{ps}")
            listening = subprocess.run(["ss", "-Hltn", f"sport = :{ps}"], capture_output=True,
                                       text=True)
            if listening.returncode == 0:
                assert listening.stdout.strip() == ""   # not a listener of this namespace
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.slow
def test_a_local_jobs_ports_are_unreachable_while_it_trains(tmp_path):
    """A real antdt-launch job: while it trains, its master, agents and TF tasks cannot
    be reached from this (the machine's) network namespace; the launcher follows the job
    over the master's Unix socket."""
    network, why = private_network.create()
    if network is None:
        pytest.skip(why)
    network.close()
    token = "test-token-for-the-private-network"
    tls = auth.make_job_ca(tmp_path / "tls")
    env = child_env(dict(os.environ, **{auth.TOKEN_ENV: token},
                         **{v: getattr(tls, k) for k, v in auth.TLS_ENV.items()}))
    workdir = tmp_path / "job"
    proc = subprocess.Popen(
        [LAUNCH_BIN, "--num_ps=1", "--num_workers=2", "--generate_records=400000",
         "--eval_records=0", "--records_per_shard=1024", "--batch_size=128", "--audit",
         "--progress=false", f"--workdir={workdir}", "--timeout_seconds=400",
         f"--report_json={tmp_path / 'report.json'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        from antdt_tf.errors import UnknownDataset
        from antdt_tf.monitor.client import MonitorClient
        from antdt_tf.sharding.client import ShardingClient

        master = f"unix:{workdir / 'master.sock'}"
        wait_for(lambda: (workdir / "master.sock").exists(), 240, "the master")
        os.environ[auth.TOKEN_ENV] = token
        tls.export()
        try:
            with ShardingClient(master, timeout=10) as admin:
                def training():
                    try:
                        datasets = admin.progress("train").datasets
                    except UnknownDataset:          # not registered yet
                        return False
                    return datasets and datasets[0].records_done_total > 0
                wait_for(lambda: proc.poll() is not None or training(), 300, "training")
            with MonitorClient(master) as monitor:
                cluster = monitor.job_cluster()
                status = monitor.status()
                master_port = (workdir / "master.port").read_text().strip()
        finally:
            os.environ.pop(auth.TOKEN_ENV)
            for var in auth.TLS_ENV.values():
                os.environ.pop(var)
        addresses = [*cluster.chief, *cluster.ps, *cluster.worker,
                     *(a.agent_address for a in status.agents), f"127.0.0.1:{master_port}"]
        assert len(addresses) == 1 + 1 + 2 + 2 + 1
        assert proc.poll() is None                   # still training while we look
        assert not [a for a in addresses if reachable(a)]
    finally:
        out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    assert "audit: applied exactly 1x" in out and "-> OK" in out
