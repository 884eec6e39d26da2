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
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert self.proc.poll() is None, (self.workdir / "agent.log").read_text()
            assert time.monotonic() < deadline, "agent did not start"
            time.sleep(0.05)
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


def master_args(tmp_path, name):
    """A light real program for the agent to run: an in-memory antdt-master."""
    return ["--port=0", f"--port_file={tmp_path / name}"]


def wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_start_list_kill_restart_and_report_to_master(tmp_path, agent, master):
    st = agent.client.start("worker", 0, "antdt-master", master_args(tmp_path, "w0"))
    assert st.state == cpb.TaskStatus.RUNNING and st.starts == 1
    assert psutil.Process(st.pid).is_running()
    wait_for(lambda: (tmp_path / "w0").exists(), what="the task to serve")
    (listed,) = agent.client.list().tasks
    assert listed.pid == st.pid and listed.state == cpb.TaskStatus.RUNNING

    # the master hears about the task from the agent
    with MonitorClient(master.address) as mon:
        def reported(state):
            agents = mon.status().agents
            return agents and agents[0].tasks and agents[0].tasks[0].state == state
        wait_for(lambda: reported(cpb.TaskStatus.RUNNING), what="a RUNNING report")
        killed = agent.client.stop("worker", 0, kill=True)
        assert killed.state == cpb.TaskStatus.STOPPED and killed.exit_code == -signal.SIGKILL
        assert not psutil.pid_exists(st.pid) or psutil.Process(st.pid).status() == "zombie"
        wait_for(lambda: reported(cpb.TaskStatus.STOPPED), what="a STOPPED report")
        status = mon.status()
        assert status.agents[0].host == "h0" and status.agents[0].agent_address == agent.address

    again = agent.client.start("worker", 0, "antdt-master", master_args(tmp_path, "w0b"))
    assert again.starts == 2 and again.pid != st.pid


def test_a_task_that_exits_on_its_own_is_reported_exited(tmp_path, agent):
    # --port=70000 is a usage error: the program exits 1 by itself
    agent.client.start("ps", 0, "antdt-master", ["--port=70000"])
    st = wait_for(lambda: next((t for t in agent.client.list().tasks
                                if t.state != cpb.TaskStatus.RUNNING), None), what="the exit")
    assert st.state == cpb.TaskStatus.EXITED and st.exit_code == 1
    assert "port" in pathlib.Path(st.log_path).read_text()


def test_throttle_slows_for_a_while_then_restores(tmp_path, agent):
    agent.client.start("worker", 1, "antdt-master", master_args(tmp_path, "w1"))
    st = agent.client.throttle("worker", 1, slowdown=3, duration_seconds=1.0)
    assert st.slowdown == 3
    proc = psutil.Process(st.pid)
    wait_for(lambda: proc.status() == psutil.STATUS_STOPPED, what="SIGSTOP duty cycle")
    wait_for(lambda: agent.client.list().tasks[0].slowdown == 1.0, what="the end of the slowdown")
    time.sleep(0.3)
    assert proc.status() != psutil.STATUS_STOPPED   # never left frozen


def test_bad_requests_get_typed_errors_and_change_nothing(tmp_path, agent):
    with pytest.raises(errors.InvalidRequest, match="unknown program"):
        agent.client.start("worker", 0, "/bin/sh", ["-c", "true"])
    with pytest.raises(errors.InvalidRequest, match="unknown job"):
        agent.client.start("evaluator", 0, "antdt-master", [])
    with pytest.raises(errors.UnknownTask):
        agent.client.stop("worker", 7)
    with pytest.raises(errors.UnknownTask):
        agent.client.throttle("ps", 3, slowdown=2)
    agent.client.start("worker", 0, "antdt-master", master_args(tmp_path, "w0"))
    with pytest.raises(errors.TaskAlreadyRunning):
        agent.client.start("worker", 0, "antdt-master", master_args(tmp_path, "w0x"))
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


def test_agent_sigterm_stops_its_tasks(tmp_path, master):
    a = AgentProcess(tmp_path, master.address)
    pid = a.client.start("worker", 0, "antdt-master", master_args(tmp_path, "w0")).pid
    a.stop(signal.SIGTERM)
    assert a.proc.returncode == 0
    wait_for(lambda: not psutil.pid_exists(pid), what="the task to end")


def test_agent_sigkill_leaves_no_orphans(tmp_path, master):
    a = AgentProcess(tmp_path, master.address)
    pid = a.client.start("worker", 0, "antdt-master", master_args(tmp_path, "w0")).pid
    a.stop(signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(pid), what="the orphan to die")


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
