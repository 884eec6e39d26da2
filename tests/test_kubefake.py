"""The fake Kubernetes cluster (``tests/kubefake``) behaves like the real API server and
kubelet where the Kubernetes backend's tests rely on it: authentication, Status errors
checked on the server side, label selectors, watch resumption and ``410 Expired``,
graceful deletes (SIGTERM, then SIGKILL after the grace period), the OOM killer,
scheduling by node affinity, owner-reference garbage collection and the cluster DNS."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from waiting import wait_for
import kubefake
from kubefake.store import matches_labels

pytestmark = pytest.mark.slow
NS = "fake-test"


@pytest.fixture
def fake():
    with kubefake.FakeCluster(nodes=["a", "b"], eviction_seconds=0.5) as f:
        yield f


def _v1(fake):
    from kubernetes import client

    return client.CoreV1Api(fake.api_client())


def _pod(name, code: str, container=None, **spec):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "t", "name": name}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2, **spec,
                     "containers": [{"name": "c", "image": "img",
                                     "command": ["python", "-c", code], **(container or {})}]}}


def _raw(fake, method: str, path: str, body=None, token: str = ""):
    req = urllib.request.Request(fake.server.url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token or fake.token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _phase(v1, name):
    return v1.read_namespaced_pod(name, NS).status.phase


def test_requests_are_authenticated_and_checked_on_the_server(fake):
    code, body = _raw(fake, "GET", "/api/v1/nodes", token="wrong")
    assert (code, body["reason"]) == (401, "Unauthorized")
    code, body = _raw(fake, "POST", f"/api/v1/namespaces/{NS}/pods",
                      {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "spec": {"containers": [{"image": "x"}]}})        # no name
    assert (code, body["reason"]) == (422, "Invalid") and "name" in body["message"]
    code, body = _raw(fake, "POST", f"/api/v1/namespaces/{NS}/services",
                      {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "Bad_Name"},
                       "spec": {"ports": [{"port": 1}]}})
    assert code == 422 and "DNS-1035" in body["message"]
    code, body = _raw(fake, "GET", f"/api/v1/namespaces/{NS}/pods/nope")
    assert (code, body["reason"]) == (404, "NotFound")
    assert matches_labels({"a": "1", "b": "2"}, "a=1,b in (2,3),!c")
    assert not matches_labels({"a": "1"}, "a!=1")


def test_a_watch_resumes_from_its_version_and_an_expired_one_is_410(fake):
    v1 = _v1(fake)
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, _pod("w1", "import time; time.sleep(30)"))
    resp = v1.list_namespaced_pod(NS, watch=True, resource_version=rv, timeout_seconds=2,
                                  _preload_content=False)
    events = [json.loads(line) for line in resp.read().splitlines() if line]
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "w1"
    assert all(e["type"] in ("ADDED", "MODIFIED") for e in events)
    fake.compact()
    resp = v1.list_namespaced_pod(NS, watch=True, resource_version=rv, timeout_seconds=2,
                                  _preload_content=False)
    (event,) = [json.loads(line) for line in resp.read().splitlines() if line]
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"


def test_graceful_delete_sends_sigterm_and_sigkill_after_the_grace(fake):
    v1 = _v1(fake)
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('term', "
                "flush=True)); time.sleep(60)")
    v1.create_namespaced_pod(NS, _pod("stubborn", stubborn))
    wait_for(lambda: fake.container_pid(NS, "stubborn"), 30, "the container to run")
    t0 = time.monotonic()
    v1.delete_namespaced_pod("stubborn", NS, grace_period_seconds=1)
    assert v1.read_namespaced_pod("stubborn", NS).metadata.deletion_timestamp is not None
    wait_for(lambda: not [p for p in fake.objects("pods")
                          if p["metadata"]["name"] == "stubborn"],
             30, "the pod to go after its grace period")
    assert time.monotonic() - t0 >= 1.0          # it ignored SIGTERM: killed after the grace
    v1.create_namespaced_pod(NS, _pod("quick", "import time; time.sleep(60)"))
    wait_for(lambda: fake.container_pid(NS, "quick"), 30, "the container to run")
    v1.delete_namespaced_pod("quick", NS, grace_period_seconds=0)    # force: gone at once
    assert not [p for p in fake.objects("pods") if p["metadata"]["name"] == "quick"]


def test_exits_signals_and_the_oom_killer_as_a_container_runtime_reports_them(fake):
    v1 = _v1(fake)
    v1.create_namespaced_pod(NS, _pod("exit3", "raise SystemExit(3)"))
    v1.create_namespaced_pod(NS, _pod("hog", "b = [bytearray(1 << 20) for _ in range(400)]; "
                                      "import time; time.sleep(30)",
                                      container={"resources": {"limits": {"memory": "100Mi"}}}))
    v1.create_namespaced_pod(NS, _pod("victim", "import time; time.sleep(60)"))
    wait_for(lambda: fake.container_pid(NS, "victim"), 30, "the victim to run")
    fake.kill_container(NS, "victim", 9)
    for name, code, reason in (("exit3", 3, "Error"), ("hog", 137, "OOMKilled"),
                               ("victim", 137, "Error")):
        wait_for(lambda n=name: _phase(v1, n) == "Failed", 30, f"{name} to fail")
        term = v1.read_namespaced_pod(name, NS).status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (code, reason), name
    assert v1.read_namespaced_pod("victim", NS).status.container_statuses[0].state \
        .terminated.signal == 9


def test_scheduling_honours_node_affinity_and_says_when_it_cannot(fake):
    v1 = _v1(fake)

    def affinity(op, values):
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": op, "values": values}]}]}}}
    v1.create_namespaced_pod(NS, _pod("elsewhere", "import time; time.sleep(30)",
                                      affinity=affinity("NotIn", ["a"])))
    v1.create_namespaced_pod(NS, _pod("nowhere", "pass", affinity=affinity("In", ["zz"])))
    wait_for(lambda: _phase(v1, "elsewhere") == "Running", 30, "the pod to run")
    assert v1.read_namespaced_pod("elsewhere", NS).spec.node_name == "b"
    conds = wait_for(lambda: v1.read_namespaced_pod("nowhere", NS).status.conditions,
                     30, "the scheduler's verdict")
    assert [(c.type, c.status, c.reason) for c in conds] == [
        ("PodScheduled", "False", "Unschedulable")]
    assert _phase(v1, "nowhere") == "Pending"


def test_owner_references_are_collected_and_dns_names_the_ready_pod(fake):
    v1 = _v1(fake)
    owner = v1.create_namespaced_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "owner"}})
    ref = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.metadata.uid}]
    serve = ("import os, socket, time; s = socket.socket(); "
             "s.bind((os.environ['POD_IP'], 8080)); s.listen(); "
             "c, _ = s.accept(); c.sendall(b'hi'); time.sleep(30)")
    pod = _pod("server", serve)
    pod["metadata"]["ownerReferences"] = ref
    pod["spec"]["containers"][0]["env"] = [{"name": "POD_IP", "valueFrom": {
        "fieldRef": {"fieldPath": "status.podIP"}}}]
    v1.create_namespaced_pod(NS, pod)
    v1.create_namespaced_service(NS, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "server", "ownerReferences": ref},
        "spec": {"clusterIP": "None", "selector": {"name": "server"},
                 "ports": [{"port": 8080}]}})
    ip = wait_for(lambda: fake.resolve(f"server.{NS}.svc.cluster.local"), 30, "a DNS name")
    assert ip == v1.read_namespaced_pod("server", NS).status.pod_ip and ip.startswith("127.64.")
    with socket.create_connection((ip, 8080), timeout=10) as c:
        assert wait_for(lambda: c.recv(2), 30, "the answer") == b"hi"
    v1.delete_namespaced_config_map("owner", NS)
    wait_for(lambda: not fake.objects("pods") and not fake.objects("services"),
             30, "the owned pod and service to be collected")


def test_pod_dns_is_the_pods_own_etc_hosts():
    ok, why = kubefake.pod_dns_available()
    if not ok:
        pytest.skip(why)
    with kubefake.FakeCluster(nodes=["a"], pod_dns=True) as fake:
        v1 = _v1(fake)
        v1.create_namespaced_pod(NS, _pod("target", "import time; time.sleep(60)"))
        v1.create_namespaced_service(NS, {"apiVersion": "v1", "kind": "Service",
                                          "metadata": {"name": "target"},
                                          "spec": {"clusterIP": "None",
                                                   "selector": {"name": "target"},
                                                   "ports": [{"port": 1}]}})
        ip = wait_for(lambda: fake.resolve("target"), 30, "the service's address")
        v1.create_namespaced_pod(NS, _pod("looker", (
            "import socket, time\n"
            "for _ in range(200):\n"
            "    try:\n"
            f"        print(socket.gethostbyname('target.{NS}.svc.cluster.local'), flush=True)\n"
            "        break\n"
            "    except OSError:\n"
            "        time.sleep(0.05)\n")))
        wait_for(lambda: _phase(v1, "looker") in ("Succeeded", "Failed"), 30, "the lookup")
        log = open(f"{fake.workdir}/{NS}.looker.log").read()
        assert log.split() == [ip], log
