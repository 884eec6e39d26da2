"""The Kubernetes backend beyond the conformance suite, against the stateful fake API
(``tests/kubefake``: the unmodified ``kubernetes`` client over HTTP, a fake kubelet that
runs every pod as a real process): the objects it creates pass the API's schemas, its
watch resumes after a dropped connection and relists after ``410 Gone``, evictions and
foreign deletes map to the failure vocabulary, generations are fenced across a master
restart even after the pods are gone, and deleting the job's ConfigMap deletes the job.
"""

from __future__ import annotations

import pytest

from waiting import wait_for

from antdt_tf.proto import cluster_pb2 as cpb

from antdt_tf.backends import FailureKind, TaskName, TaskSpec, TaskState
from antdt_tf.errors import InvalidRequest, StaleGeneration

pytestmark = pytest.mark.slow
NS = "antdt-k8s-test"


@pytest.fixture
def cluster():
    import kubefake

    with kubefake.FakeCluster(nodes=["n0", "n1"], eviction_seconds=1.0) as fake:
        yield fake


def _backend(fake, **kw):
    from antdt_tf.backends.kubernetes import KubernetesBackend, KubernetesSettings

    settings = KubernetesSettings(namespace=NS, job="kb", image="antdt-tf:test", **kw)
    return KubernetesBackend(settings, client=fake.api_client(), watch_seconds=5)


@pytest.fixture
def backend(cluster):
    b = _backend(cluster)
    yield b
    b.close()


def probe(b, name: TaskName, **fields) -> TaskSpec:
    endpoint = b.endpoint(name.job, name.index, "")
    return TaskSpec(name, cpb.PROBE_TASK, cpb.ProbeTaskArgs(endpoint=endpoint,
                                                            name=str(name), **fields),
                    endpoint=endpoint)


def state(b, name):
    info = b.launch_info(name)
    return info.state if info is not None else None


def test_pods_and_services_pass_the_api_schemas(backend):
    import kubeschema

    spec = TaskSpec(TaskName("worker", 1, 3), cpb.PROBE_TASK,
                    cpb.ProbeTaskArgs(endpoint=backend.endpoint("worker", 1, "n0"),
                                      allocate_mb=1),
                    endpoint=backend.endpoint("worker", 1, "n0"),
                    memory_limit_bytes=300 << 20)
    pod = backend.pod_body(spec, "n0")
    kubeschema.validate(pod)
    kubeschema.validate(backend.service_body("worker", 1))
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container["resources"]["limits"]["memory"] == "300Mi"
    assert "--endpoint=$(ANTDT_POD_IP):2222" in container["args"]
    assert pod["metadata"]["labels"]["antdt.io/generation"] == "3"
    term = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In",
                                         "values": ["n0"]}]
    # a path outside the job's volume is refused before anything is created
    bad = TaskSpec(TaskName("ps", 0), cpb.TF_SERVER, cpb.TfServerArgs(
        job="ps", index=0, standby_file="/etc/passwd", cluster=cpb.ClusterAddresses(jobs={
            "ps": cpb.ClusterAddresses.Addresses(address=["a:1"]),
            "worker": cpb.ClusterAddresses.Addresses(address=["b:1"])})))
    with pytest.raises(InvalidRequest, match="outside the job root"):
        backend.launch(bad, "n0")
    assert not [p for p in backend.pods.all() if p["metadata"]["name"].endswith("ps-0-g1")]


def test_the_watch_resumes_after_a_drop_and_relists_after_410(cluster, backend):
    name = TaskName("worker", 0)
    backend.launch(probe(backend, name), "n0")
    wait_for(lambda: state(backend, name) is TaskState.RUNNING
             and cluster.container_pid(NS, backend.pod_name(name)), 30, "the pod to run")
    resumes = backend.pods.resumes
    cluster.drop_watches()
    wait_for(lambda: backend.pods.resumes > resumes, 30, "the watch to resume")
    crash = TaskName("worker", 1)
    backend.launch(probe(backend, crash, exit_after_seconds=0, exit_code=4), "n1")
    info = wait_for(lambda: (i := backend.launch_info(crash)) and not i.running and i,
                    30, "the crash to be seen through the resumed watch")
    assert (info.failure.kind, info.failure.exit_code) == (FailureKind.EXITED, 4)
    relists = backend.pods.relists
    cluster.compact()
    cluster.drop_watches()        # the resumed watch's version is gone: 410, relist
    wait_for(lambda: backend.pods.relists > relists, 30, "a relist after 410 Gone")
    cluster.kill_container(NS, backend.pod_name(name), 9)
    info = wait_for(lambda: (i := backend.launch_info(name)) and not i.running and i,
                    30, "the kill to be seen after the relist")
    assert (info.failure.kind, info.failure.exit_code) == (FailureKind.KILLED, -9)


def test_evictions_and_foreign_deletes_are_failures(cluster, backend):
    memory, other, deleted = TaskName("worker", 0), TaskName("worker", 1), TaskName("ps", 0)
    for n, host in ((memory, "n0"), (other, "n1"), (deleted, "n0")):
        backend.launch(probe(backend, n), host)
    for n in (memory, other, deleted):
        wait_for(lambda n=n: cluster.container_pid(NS, backend.pod_name(n)), 30, f"{n} to run")
    cluster.evict(NS, backend.pod_name(memory), "The node was low on resource: memory.")
    cluster.evict(NS, backend.pod_name(other), "The node had condition: [DiskPressure].")
    backend.core.delete_namespaced_pod(backend.pod_name(deleted), NS, grace_period_seconds=0)
    kinds = {}
    for n in (memory, other, deleted):
        info = wait_for(lambda n=n: (i := backend.launch_info(n)) and not i.running and i,
                        30, f"{n} to end")
        assert info.state is TaskState.FAILED, info
        kinds[n] = info.failure.kind
    assert kinds == {memory: FailureKind.OUT_OF_MEMORY, other: FailureKind.KILLED,
                     deleted: FailureKind.KILLED}


def test_generations_stay_fenced_after_a_restart_when_the_pods_are_gone(cluster, backend):
    g2 = TaskName("worker", 0, 2)
    backend.launch(probe(backend, g2), "n0")
    wait_for(lambda: state(backend, g2) is TaskState.RUNNING, 30, "g2 to run")
    assert backend.stop(g2, grace_seconds=2).state is TaskState.STOPPED
    wait_for(lambda: not [p for p in backend.pods.all()
                          if p["metadata"]["name"] == backend.pod_name(g2)], 30, "g2's pod to go")
    fresh = _backend(cluster)             # a restarted master: no pod of the task is left
    try:
        with pytest.raises(StaleGeneration):
            fresh.launch(probe(fresh, TaskName("worker", 0, 1)), "n1")
        with pytest.raises(StaleGeneration):
            fresh.launch(probe(fresh, g2), "n0")     # g2 ran: it is never run twice
        g3 = fresh.launch(probe(fresh, TaskName("worker", 0, 3)), "n1")
        assert g3.running and g3.host == "n1"
    finally:
        fresh.close()


def test_deleting_the_job_configmap_deletes_its_pods_and_services(cluster, backend):
    names = [TaskName("ps", 0), TaskName("worker", 0)]
    for n in names:
        backend.launch(probe(backend, n), "n1")
    for n in names:
        wait_for(lambda n=n: state(backend, n) is TaskState.RUNNING, 30, f"{n} to run")
    assert len(backend.core.list_namespaced_service(NS).items) == 2
    backend.release_all()
    wait_for(lambda: not backend.core.list_namespaced_pod(NS).items, 30, "the pods to go")
    wait_for(lambda: not backend.core.list_namespaced_service(NS).items, 30, "the services to go")
    for n in names:
        assert state(backend, n) is TaskState.STOPPED


def test_a_cordoned_node_is_no_host_and_a_launch_there_is_refused(cluster, backend):
    from antdt_tf.errors import Unschedulable

    backend.core.patch_node("n1", {"spec": {"unschedulable": True}})     # kubectl cordon
    wait_for(lambda: [h.name for h in backend.hosts()] == ["n0"], 30, "n1 to leave the hosts")
    with pytest.raises(Unschedulable, match="not a Ready node"):
        backend.launch(probe(backend, TaskName("worker", 0)), "n1")
    assert backend.place() == "n0"
    assert not backend.pods.all()              # nothing was created
