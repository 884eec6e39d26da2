"""A real antdt-agent process: it starts, stops, kills and throttles the tasks it owns,
reports them to a real master, rejects bad requests, and leaves no orphans."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc
import psutil
import pytest

from antdt_tf import errors
from antdt_tf.agent.client import AgentClient
from antdt_tf.monitor.client import MonitorClient
from antdt_tf.procutil import child_env
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.proto import cluster_pb2_grpc as cpb_grpc
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState
from procs import reachable
from waiting import wait_for

AGENT_BIN = str(pathlib.Path(sys.executable).parent / "antdt-agent")


class AgentProcess:
    def __init__(self, workdir, master=""):
        self.workdir = pathlib.Path(workdir)
        port_file = self.workdir / "agent.port"
        self.log = open(self.workdir / "agent.log", "wb")
        self.proc = subprocess.Popen(
            [AGENT_BIN, "--host_name=h0", "--port=0", f"--port_file={port_file}",
             f"--master={master}", f"--task_log_dir={self.workdir / 'tasks'}",
             "--report_seconds=0.2"], stdout=self.log, stderr=self.log,
            start_new_session=True, env=child_env())
        def serving():
            assert self.proc.poll() is None, (self.workdir / "agent.log").read_text()
            return port_file.exists()
        wait_for(serving, 30, "the agent to serve")
        self.address = f"127.0.0.1:{port_file.read_text().strip()}"
        self.client = AgentClient(self.address, timeout=20)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(30)
        self.client.close()
        self.log.close()


@pytest.fixture
def master():
    with BackgroundMaster(ShardingServicer(ShardState()), tick_seconds=0.1) as m:
        yield m


@pytest.fixture
def agent(tmp_path, master):
    a = AgentProcess(tmp_path, master.address)
    yield a
    a.stop()


def probe(**fields):
    """A light real program for the agent to run: a probe task serving a port."""
    return cpb.ProbeTaskArgs(**fields)


def free_endpoint() -> str:
    from antdt_tf.tf.local_cluster import free_ports

    return f"127.0.0.1:{free_ports(1)[0]}"


def test_start_list_kill_restart_and_report_to_master(tmp_path, agent, master):
    endpoint = free_endpoint()
    st = agent.client.start("worker", 0, cpb.PROBE_TASK, probe(endpoint=endpoint))
    assert st.state == cpb.TaskStatus.RUNNING and st.starts == 1
    assert psutil.Process(st.pid).is_running()
    wait_for(lambda: reachable(endpoint), 20, "the task to serve")
    (listed,) = agent.client.list().tasks
    assert listed.pid == st.pid and listed.state == cpb.TaskStatus.RUNNING

    # the master hears about the task from the agent
    with MonitorClient(master.address) as mon:
        def reported(state):
            agents = mon.status().agents
            return agents and agents[0].tasks and agents[0].tasks[0].state == state
        wait_for(lambda: reported(cpb.TaskStatus.RUNNING), 20, "a RUNNING report")
        killed = agent.client.stop("worker", 0, kill=True)
        assert killed.state == cpb.TaskStatus.STOPPED and killed.exit_code == -signal.SIGKILL
        assert not psutil.pid_exists(st.pid) or psutil.Process(st.pid).status() == "zombie"
        wait_for(lambda: reported(cpb.TaskStatus.STOPPED), 20, "a STOPPED report")
        status = mon.status()
        assert status.agents[0].host == "h0" and status.agents[0].agent_address == agent.address

    again = agent.client.start("worker", 0, cpb.PROBE_TASK, probe())
    assert again.starts == 2 and again.pid != st.pid


def test_a_task_that_exits_on_its_own_is_reported_exited(tmp_path, agent):
    agent.client.start("ps", 0, cpb.PROBE_TASK, probe(exit_after_seconds=0, exit_code=3))
    st = wait_for(lambda: next((t for t in agent.client.list().tasks
                                if t.state != cpb.TaskStatus.RUNNING), None), 20, "the exit")
    assert st.state == cpb.TaskStatus.EXITED and st.exit_code == 3
    assert "PROBE_TASK" in pathlib.Path(st.log_path).read_text()


def test_throttle_slows_for_a_while_then_restores(tmp_path, agent):
    agent.client.start("worker", 1, cpb.PROBE_TASK, probe())
    st = agent.client.throttle("worker", 1, slowdown=3, duration_seconds=1.0)
    assert st.slowdown == 3
    proc = psutil.Process(st.pid)
    wait_for(lambda: proc.status() == psutil.STATUS_STOPPED, 20, "SIGSTOP duty cycle")
    wait_for(lambda: agent.client.list().tasks[0].slowdown == 1.0, 20, "the end of the slowdown")
    time.sleep(0.3)
    assert proc.status() != psutil.STATUS_STOPPED   # never left frozen


def test_bad_requests_get_typed_errors_and_change_nothing(tmp_path, agent):
    with pytest.raises(errors.InvalidRequest, match="unknown program"):
        agent.client.start("worker", 0, 99, probe())
    with pytest.raises(errors.InvalidRequest, match="takes its arguments in 'tf_server'"):
        agent.client.start("worker", 0, cpb.TF_SERVER, probe())
    with pytest.raises(errors.InvalidRequest, match="unknown job"):
        agent.client.start("evaluator", 0, cpb.PROBE_TASK, probe())
    with pytest.raises(errors.UnknownTask):
        agent.client.stop("worker", 7)
    with pytest.raises(errors.UnknownTask):
        agent.client.throttle("ps", 3, slowdown=2)
    agent.client.start("worker", 0, cpb.PROBE_TASK, probe())
    with pytest.raises(errors.TaskAlreadyRunning):
        agent.client.start("worker", 0, cpb.PROBE_TASK, probe())
    with pytest.raises(errors.InvalidRequest, match="slowdown"):
        agent.client.throttle("worker", 0, slowdown=0.5)
    # bytes that are not a StartTaskRequest at all
    with grpc.insecure_channel(agent.address) as ch:
        raw = ch.unary_unary("/antdt.v1.Agent/StartTask")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff", timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (only,) = agent.client.list().tasks
    assert only.state == cpb.TaskStatus.RUNNING and only.starts == 1


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def test_a_caller_cannot_smuggle_environment_into_a_task(tmp_path, agent):
    """The old ``env`` field (4) is gone from StartTaskRequest: bytes that still carry it
    (here PYTHONPATH pointing at a sitecustomize.py that would run at interpreter start)
    reach the agent as an unknown field and the task's environment is the agent's own."""
    hook, marker = tmp_path / "hook", tmp_path / "pwned"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    endpoint = free_endpoint()
    req = cpb.StartTaskRequest(task=cpb.TaskRef(job="worker", index=0),
                               program=cpb.PROBE_TASK, probe=probe(endpoint=endpoint))
    key, value = b"PYTHONPATH", str(hook).encode()
    entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value
    raw = req.SerializeToString() + b"\x22" + _varint(len(entry)) + entry
    with grpc.insecure_channel(agent.address) as ch:
        st = ch.unary_unary("/antdt.v1.Agent/StartTask",
                            response_deserializer=cpb.TaskStatus.FromString)(raw, timeout=20)
    assert st.state == cpb.TaskStatus.RUNNING
    wait_for(lambda: reachable(endpoint), 20, "the probe to serve")   # it started
    assert psutil.Process(st.pid).environ().get("PYTHONPATH", "") != str(hook)
    assert not marker.exists()


def test_paths_outside_the_job_root_and_smuggled_flags_are_refused(tmp_path, agent):
    root = tmp_path / "tasks"              # the agent's job root (its --task_log_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)

    def chief(**fields):
        args = dict(master="127.0.0.1:7470", dataset="train", batch_size=8, buckets=64,
                    learning_rate=0.1)
        args.update(fields)
        return cpb.ChiefArgs(**args)

    refused = {
        "outside the job root": chief(report_json=str(outside / "r.json")),
        "outside the job root ": chief(checkpoint_dir="/etc/antdt"),
        "outside the job root  ": chief(report_json=str(root / "link" / "r.json")),
        "outside the job root   ": chief(tensorboard_dir=str(root / ".." / "outside")),
        "absolute path": chief(report_json="r.json"),
        "dataset must match": chief(dataset="--flagfile=/etc/passwd"),
        "master must be host:port": chief(master="127.0.0.1:1 --flagfile=/etc/passwd"),
        "must be > 0": chief(batch_size=-1),
    }
    for reason, args in refused.items():
        with pytest.raises(errors.InvalidRequest, match=reason.strip()):
            agent.client.start("chief", 0, cpb.PSS_CHIEF, args)
    with pytest.raises(errors.InvalidRequest, match="outside the job root"):
        agent.client.start("worker", 0, cpb.TF_SERVER, cpb.TfServerArgs(
            cluster=cpb.ClusterAddresses(jobs={
                "ps": cpb.ClusterAddresses.Addresses(address=["127.0.0.1:1"]),
                "worker": cpb.ClusterAddresses.Addresses(address=["127.0.0.1:2"])}),
            job="worker", index=0, standby_file="/tmp/elsewhere"))
    assert list(agent.client.list().tasks) == []     # nothing started
    assert list(outside.iterdir()) == []


def test_agent_sigterm_stops_its_tasks(tmp_path, master):
    a = AgentProcess(tmp_path, master.address)
    pid = a.client.start("worker", 0, cpb.PROBE_TASK, probe()).pid
    a.stop(signal.SIGTERM)
    assert a.proc.returncode == 0
    wait_for(lambda: not psutil.pid_exists(pid), 20, "the task to end")


def test_agent_sigkill_leaves_no_orphans(tmp_path, master):
    a = AgentProcess(tmp_path, master.address)
    pid = a.client.start("worker", 0, cpb.PROBE_TASK, probe()).pid
    a.stop(signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(pid), 20, "the orphan to die")


def test_monitor_ignores_late_reports_and_rejects_bad_ones(master):
    with grpc.insecure_channel(master.address) as ch:
        stub = cpb_grpc.ClusterMonitorStub(ch)
        task = cpb.TaskStatus(task=cpb.TaskRef(job="worker", index=0),
                              state=cpb.TaskStatus.RUNNING)
        new = cpb.AgentReport(host="h1", agent_address="a:1", seq=5, tasks=[task])
        assert stub.ReportAgent(new).accepted
        late = cpb.AgentReport(host="h1", agent_address="a:1", seq=4)
        assert not stub.ReportAgent(late).accepted        # delivered late: ignored
        assert not stub.ReportAgent(new).accepted         # duplicate: ignored
        restarted = cpb.AgentReport(host="h1", agent_address="a:2", seq=1)
        assert stub.ReportAgent(restarted).accepted       # a new agent process
        for bad in (cpb.AgentReport(seq=1),
                    cpb.AgentReport(host="h", seq=1, tasks=[cpb.TaskStatus(
                        task=cpb.TaskRef(job="gpu", index=0))]),
                    cpb.AgentReport(host="h", seq=0)):
            with pytest.raises(grpc.RpcError) as e:
                stub.ReportAgent(bad)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        tr = cpb.TrainerReport(task=cpb.TaskRef(job="chief"), incarnation=2, seq=3,
                               workers=[cpb.WorkerStats(worker=0, shards=1, records=10)])
        assert stub.ReportTrainer(tr).accepted
        older = cpb.TrainerReport(task=cpb.TaskRef(job="chief"), incarnation=1, seq=9)
        assert not stub.ReportTrainer(older).accepted     # a replaced coordinator
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportTrainer(cpb.TrainerReport(task=cpb.TaskRef(job="chief"), seq=4,
                                                 incarnation=2, workers=[
                                                     cpb.WorkerStats(worker=0, shards=-1)]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = stub.GetClusterStatus(cpb.ClusterStatusRequest())
        assert [a.agent_address for a in status.agents] == ["a:2"]
        assert status.trainer.workers[0].records == 10
