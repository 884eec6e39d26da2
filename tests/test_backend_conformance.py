"""The ClusterBackend conformance suite: what every backend must do, run against each.

- ``local``: simulated hosts, one real ``antdt-agent`` each on loopback;
- ``agents``: real hosts — three network namespaces with their own addresses in
  198.18.0.0/24 — each with an ``antdt-agent`` that registers with a real master
  (rendezvous), every call authenticated with the job's token.

Tasks are ``antdt-probe-task`` processes (real processes that serve a TCP port and exit
or allocate memory on cue), so the suite runs in seconds. The Ray and Kubernetes
backends pass the same tests:

- ``ray``: a three-node Ray cluster on loopback;
- ``kubernetes``: the Kubernetes backend on the unmodified ``kubernetes`` client against
  a stateful fake API server with a fake kubelet that runs every pod as a real process
  (``tests/kubefake``); every object the backend creates passes the API's schema check;
- ``kubernetes-cluster`` (``-m kubernetes``): the same tests against a real cluster,
  when ``ANTDT_TEST_KUBECONFIG`` names one (skipped otherwise; docs/kubernetes.md).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
from typing import Callable

import pytest

from antdt_tf.proto import cluster_pb2 as cpb

from antdt_tf.backends import (ClusterBackend, FailureKind, Placement, TaskName, TaskSpec,
                               TaskState)
from antdt_tf.errors import StaleGeneration, TaskAlreadyRunning, Unschedulable
from waiting import wait_for

pytestmark = pytest.mark.slow
HOST_TIMEOUT = 3.0


@dataclasses.dataclass
class Env:
    backend: ClusterBackend
    hosts: list[str]
    lose: Callable[[str], None]         # every process of that host dies at once
    new_backend: Callable[[], ClusterBackend]   # another backend over the same hosts
    # SIGKILL the process of a launch (not through the backend: a fault)
    kill: Callable[[ClusterBackend, object], None] = (
        lambda backend, info: os.kill(info.pid, signal.SIGKILL))
    resolve: Callable[[str], str] = lambda endpoint: endpoint   # the cluster's DNS


def _local_env(tmp_path):
    from antdt_tf.backends.agents import AgentsBackend, StaticHosts
    from antdt_tf.backends.local import LocalBackend

    backend = LocalBackend(3, tmp_path, host_timeout=HOST_TIMEOUT)
    addresses = list(backend.directory.addresses)
    others = []

    def new_backend():
        b = AgentsBackend(StaticHosts(addresses), host_timeout=HOST_TIMEOUT)
        others.append(b)
        return b
    try:
        yield Env(backend, ["host0", "host1", "host2"], backend.lose_host, new_backend)
    finally:
        for b in others:
            b.close()
        backend.shutdown()


def _agents_env(tmp_path, monkeypatch):
    import netns

    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    from antdt_tf.backends.agents import AgentsBackend, MasterRendezvous

    netns.job_security(tmp_path / "tls", monkeypatch.setenv)  # our clients and every process
    with netns.NetnsHosts(3) as net:
        master_address = netns.start_antdt_cluster(net, tmp_path)
        backends = []

        def new_backend():
            b = AgentsBackend(MasterRendezvous(master_address), host_timeout=HOST_TIMEOUT)
            backends.append(b)
            return b
        backend = new_backend()
        wait_for(lambda: len(backend.hosts()) == 3, 60, "three agents to register", interval=0.1)
        try:
            yield Env(backend, ["h0", "h1", "h2"], lambda h: net.kill_host(int(h[1:])),
                      new_backend)
        finally:
            for b in backends:
                b.close()


def _ray_env(tmp_path, monkeypatch):
    import raycluster

    with raycluster.RayTestCluster(3) as cluster:
        from antdt_tf.backends.ray import RayBackend

        def new_backend():
            return RayBackend("antdt-conformance", cluster.address, log_dir=str(tmp_path))
        backend = new_backend()
        try:
            yield Env(backend, ["h0", "h1", "h2"], cluster.lose, new_backend)
        finally:
            backend.release_all()


def _kubernetes_env(tmp_path):
    import kubefake

    from antdt_tf.backends.kubernetes import KubernetesBackend, KubernetesSettings

    settings = KubernetesSettings(namespace="antdt-conformance", job="conf", image="antdt-tf:test",
                                  unschedulable_seconds=5)
    with kubefake.FakeCluster(nodes=["h0", "h1", "h2"], eviction_seconds=1.0) as fake:
        backends = []

        def new_backend():
            b = KubernetesBackend(settings, client=fake.api_client(), watch_seconds=5)
            backends.append(b)
            return b

        def kill(backend, info):
            fake.kill_container(settings.namespace, backend.pod_name(info.name), 9)

        def resolve(endpoint):
            host, port = endpoint.rsplit(":", 1)
            ip = fake.resolve(host)
            assert ip, f"the cluster DNS has no address for {host}"
            return f"{ip}:{port}"
        backend = new_backend()
        try:
            yield Env(backend, ["h0", "h1", "h2"], fake.lose_node, new_backend, kill, resolve)
        finally:
            for b in backends:
                b.close()


def _kubernetes_cluster_env(tmp_path):
    """A real cluster (``ANTDT_TEST_KUBECONFIG``, namespace ``ANTDT_TEST_NAMESPACE``,
    image ``ANTDT_TEST_IMAGE``): host loss and killing a process are not the test's to
    do there, so the tests that need them skip."""
    kubeconfig = os.environ.get("ANTDT_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("no real cluster: set ANTDT_TEST_KUBECONFIG (docs/kubernetes.md)")
    from antdt_tf.backends.kubernetes import KubernetesBackend, KubernetesSettings, api_client

    settings = KubernetesSettings(
        namespace=os.environ.get("ANTDT_TEST_NAMESPACE", "antdt-test"),
        job=f"conf{os.getpid() % 100000}",
        image=os.environ.get("ANTDT_TEST_IMAGE", "antdt-tf:latest"))
    backends = []

    def new_backend():
        b = KubernetesBackend(settings, client=api_client(kubeconfig))
        backends.append(b)
        return b

    def unsupported(*_):
        pytest.skip("not done to a real cluster's nodes or processes")
    backend = new_backend()
    hosts = [h.name for h in backend.hosts()][:3]
    if len(hosts) < 3:
        pytest.skip("the conformance suite needs three Ready nodes")
    try:
        yield Env(backend, hosts, unsupported, new_backend, unsupported)
    finally:
        backend.release_all()
        for b in backends:
            b.close()


@pytest.fixture(params=["local", "agents", "ray", "kubernetes",
                        pytest.param("kubernetes-cluster", marks=pytest.mark.kubernetes)])
def env(request, tmp_path, monkeypatch):
    if request.param == "local":
        yield from _local_env(tmp_path)
    elif request.param == "agents":
        yield from _agents_env(tmp_path, monkeypatch)
    elif request.param == "ray":
        yield from _ray_env(tmp_path, monkeypatch)
    elif request.param == "kubernetes":
        yield from _kubernetes_env(tmp_path)
    else:
        yield from _kubernetes_cluster_env(tmp_path)


def probe(backend: ClusterBackend, name: TaskName, host: str, memory_limit_bytes: int = 0,
          **fields) -> TaskSpec:
    endpoint = backend.endpoint(name.job, name.index, host)
    return TaskSpec(name, cpb.PROBE_TASK,
                    cpb.ProbeTaskArgs(endpoint=endpoint, name=f"{name.job}:{name.index}",
                                      **fields),
                    endpoint=endpoint, memory_limit_bytes=memory_limit_bytes)


def state_of(backend, name: TaskName):
    info = backend.tasks().get(name.key)
    return info if info is not None and info.name == name else None


def wait_state(backend, name: TaskName, state: TaskState, timeout: float = 30):
    wait_for(lambda: (i := state_of(backend, name)) is not None and i.state is state, timeout,
             lambda: f"{name} to be {state.value} (now {state_of(backend, name)})",
             interval=0.1)
    return state_of(backend, name)


def reach(endpoint: str, resolve=lambda e: e) -> str:
    """What the task at ``endpoint`` answers (``resolve``: the cluster's DNS, asked
    again on every try, as a relaunched task's address changes under its name)."""
    errors = []

    def answer():
        try:
            host, port = resolve(endpoint).rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=2) as c:
                return c.recv(64).decode().strip()
        except (OSError, AssertionError) as e:
            errors.append(e)
            return None
    return wait_for(answer, 30, lambda: f"an answer at {endpoint} (last error: "
                    f"{errors[-1] if errors else None!r})", interval=0.1)


def test_a_launch_serves_at_its_endpoint_and_a_retried_launch_runs_nothing_twice(env):
    b = env.backend
    assert sorted(h.name for h in b.hosts()) == env.hosts
    host = b.place()
    name = TaskName("worker", 0, 1)
    spec = probe(b, name, host)
    first = b.launch(spec, host)
    assert first.running and first.host == host and first.endpoint == spec.endpoint
    assert reach(spec.endpoint, env.resolve) == "probe worker:0"  # reachable from elsewhere
    assert first.pid or first.uid                            # something tells runs apart
    again = b.launch(spec, host)                             # a retried launch
    assert (again.pid, again.uid) == (first.pid, first.uid) and again.running
    info = b.tasks()[name.key]
    assert (info.name, info.host, info.pid, info.uid, info.state) == (
        name, host, first.pid, first.uid, TaskState.RUNNING)


def test_task_ends_map_to_one_failure_vocabulary(env):
    b = env.backend
    h = env.hosts
    done = TaskName("worker", 0)
    crash = TaskName("worker", 1)
    killed = TaskName("ps", 0)
    stopped = TaskName("ps", 1)
    oom = TaskName("chief", 0)
    b.launch(probe(b, done, h[0], exit_after_seconds=0), h[0])
    b.launch(probe(b, crash, h[1], exit_after_seconds=0, exit_code=3), h[1])
    victim = b.launch(probe(b, killed, h[2]), h[2])
    b.launch(probe(b, stopped, h[0]), h[0])
    b.launch(probe(b, oom, h[1], allocate_mb=400, memory_limit_bytes=150 << 20), h[1])

    assert wait_state(b, done, TaskState.SUCCEEDED).failure is None
    f = wait_state(b, crash, TaskState.FAILED).failure
    assert (f.kind, f.exit_code) == (FailureKind.EXITED, 3) and "code 3" in str(f)
    wait_state(b, killed, TaskState.RUNNING)
    env.kill(b, victim)                        # a process the test's agent (kubelet) started
    f = wait_state(b, killed, TaskState.FAILED).failure
    assert (f.kind, f.exit_code) == (FailureKind.KILLED, -9)
    wait_state(b, stopped, TaskState.RUNNING)
    assert b.stop(stopped, grace_seconds=5).state is TaskState.STOPPED   # not a failure
    f = wait_state(b, oom, TaskState.FAILED).failure
    assert f.kind is FailureKind.OUT_OF_MEMORY


def test_relaunch_away_from_a_host_with_generation_fencing(env):
    b = env.backend
    g1 = TaskName("worker", 2, 1)
    first_host = env.hosts[0]
    b.launch(probe(b, g1, first_host), first_host)
    g2 = TaskName("worker", 2, 2)
    with pytest.raises(TaskAlreadyRunning):        # the old launch still runs
        b.launch(probe(b, g2, env.hosts[1]), env.hosts[1])
    b.stop(g1, kill=True)
    other = b.place(Placement(avoid=frozenset({first_host})))
    assert other != first_host
    spec = probe(b, g2, other)
    moved = b.launch(spec, other)
    assert moved.host == other and moved.name == g2
    assert reach(spec.endpoint, env.resolve) == "probe worker:2"
    if b.capabilities.stable_endpoints:
        assert spec.endpoint == b.endpoint("worker", 2, first_host)
    elif len({h.address for h in b.hosts()}) > 1:
        assert spec.endpoint.rsplit(":", 1)[0] != b.endpoint(
            "worker", 2, first_host).rsplit(":", 1)[0]          # another host's address
    else:                        # hosts that share an address (Ray nodes on 127.0.0.1)
        assert spec.endpoint != b.endpoint("worker", 2, first_host)
    # fencing: the older generation can neither be launched again nor stop the new one
    with pytest.raises(StaleGeneration):
        b.launch(probe(b, g1, first_host), first_host)
    assert not b.stop(g1, kill=True).running          # stops exactly g1 (long gone)
    assert b.tasks()[g2.key].running and b.tasks()[g2.key].name == g2
    g3 = TaskName("worker", 2, 3)                      # g3 replaces g2 on g2's host
    b.stop(g2, kill=True)
    b.launch(probe(b, g3, other), other)
    with pytest.raises(StaleGeneration):               # the agent there runs g3 now
        b.stop(g2, kill=True)
    assert b.tasks()[g2.key].running and b.tasks()[g2.key].name == g3
    pinned = b.place(Placement(pin_to=env.hosts[2]))
    assert pinned == env.hosts[2]
    with pytest.raises(Unschedulable):
        b.place(Placement(pin_to="no-such-host"))


def test_host_loss_fails_its_tasks_as_host_lost_and_hosts_shrink(env):
    b = env.backend
    lost, kept = env.hosts[1], env.hosts[0]
    on_lost = [TaskName("worker", 0), TaskName("ps", 0)]
    survivor = TaskName("worker", 1)
    for name in on_lost:
        b.launch(probe(b, name, lost), lost)
    b.launch(probe(b, survivor, kept), kept)
    for name in on_lost + [survivor]:
        wait_state(b, name, TaskState.RUNNING)
    env.lose(lost)
    for name in on_lost:
        f = wait_state(b, name, TaskState.FAILED, timeout=HOST_TIMEOUT + 30).failure
        assert f.kind is FailureKind.HOST_LOST, f
    assert lost not in {h.name for h in b.hosts()}
    assert b.tasks()[survivor.key].running
    with pytest.raises(Unschedulable):
        b.place(Placement(pin_to=lost))
    # the lost host's tasks come back elsewhere as their next generation
    for name in on_lost:
        nxt = dataclasses.replace(name, generation=name.generation + 1)
        where = b.place(Placement(avoid=frozenset({lost})))
        assert b.launch(probe(b, nxt, where), where).running


def test_a_new_backend_sees_what_runs_and_launches_nothing_twice(env):
    """A restarted controller (a new backend object over the same hosts) reconciles:
    it lists the running tasks and a repeated launch returns them."""
    b = env.backend
    specs = {}
    for name, host in ((TaskName("ps", 0, 4), env.hosts[0]),
                       (TaskName("worker", 0, 2), env.hosts[2])):
        specs[name] = (probe(b, name, host), host)
        b.launch(*specs[name])
    before = {k: (i.pid, i.uid) for k, i in b.tasks().items()}
    fresh = env.new_backend()
    wait_for(lambda: len(fresh.hosts()) >= 3, 30, "the hosts", interval=0.1)
    seen = fresh.tasks()
    assert {k: (i.name, (i.pid, i.uid), i.running) for k, i in seen.items()} == {
        n.key: (n, before[n.key], True) for n in specs}
    for name, (spec, host) in specs.items():
        again = fresh.launch(spec, host)
        assert (again.pid, again.uid) == before[name.key]        # nothing started twice
    with pytest.raises(StaleGeneration):
        fresh.launch(probe(fresh, TaskName("ps", 0, 3), env.hosts[1]), env.hosts[1])


def test_slow_down_throttles_the_real_process(env):
    b = env.backend
    if not b.capabilities.fault_injection:
        with pytest.raises(NotImplementedError):
            b.slow_down(TaskName("worker", 0), 3.0)
        pytest.skip(f"{type(b).__name__} has no fault injection (capabilities)")
    name = TaskName("worker", 0)
    b.launch(probe(b, name, env.hosts[0]), env.hosts[0])
    wait_state(b, name, TaskState.RUNNING)
    assert b.slow_down(name, 3.0).slowdown == 3.0
    assert b.tasks()[name.key].slowdown == 3.0
    assert b.slow_down(name, 1.0).slowdown == 1.0
