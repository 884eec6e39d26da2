"""KubernetesBackend: a job's tasks as pods the master creates in its namespace.

The master runs in the cluster (``deploy/kubernetes/``) and creates every PS, worker and
chief pod itself, on the official ``kubernetes`` client (the ``[kubernetes]`` extra):

- one pod per launch, ``antdt-<job>-<role>-<index>-g<generation>``, with
  ``restartPolicy: Never`` (the Controller decides about restarts, never the kubelet),
  pinned to the node the Controller chose by a required node affinity on
  ``kubernetes.io/hostname`` (a move is a launch on a node ``place`` picked with the old
  one avoided);
- one headless Service per task, ``antdt-<job>-<role>-<index>``, selecting the task's
  pods whatever their generation: the task's address is its DNS name, so a relaunched
  task keeps it on any node (``capabilities.stable_endpoints``) and TF's
  ParameterServerStrategy re-joins a moved worker without rebuilding the chief. The
  Service publishes ready pods only and a TF server's pod is ready once it serves (a
  TCP readiness probe), so a standby waiting to take over a moved task's address is not
  in the DNS before it does;
- labels ``antdt.io/job``, ``antdt.io/role``, ``antdt.io/index``,
  ``antdt.io/generation`` on every pod; every pod and Service is owned (ownerReferences)
  by the job's ConfigMap ``antdt-job-<job>``, so ``kubectl delete configmap`` of it
  deletes the whole job, and the ConfigMap keeps each task's newest generation, so a
  restarted master refuses an older launch even after its pod is gone (fencing).

Task states come from a watch of the job's pods and of the nodes (resumed from the last
resource version after a dropped connection; relisted after ``410 Gone``), mapped to the
backends' vocabulary: a container that exited is ``EXITED`` with its code,
``OOMKilled`` is ``OUT_OF_MEMORY``, a container ended by a signal (exit code 128+N) is
``KILLED``, an eviction is ``OUT_OF_MEMORY`` when the kubelet evicted for memory and
``KILLED`` otherwise, a pod on a node that is not Ready (or gone) is ``HOST_LOST`` — and
is force-deleted then, so that its kubelet kills it should the node come back — a pod
deleted by someone else is ``KILLED``, and a pod the scheduler cannot place for
``unschedulable_seconds`` is deleted and ``UNSCHEDULABLE``.

What it cannot do: slow a task down or signal its process (no fault injection on a
cluster: ``capabilities.fault_injection`` is False); a task's pid is not known (its
``uid`` is the pod's). The watch cache is ``k8s_informer``, the settings and the API
client ``k8s_settings``.
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import logging
import math
import threading
import time
from typing import Optional

from antdt_tf.agent.client import start_request
from antdt_tf.agent.programs import PathPolicy, command_for
from antdt_tf.backends.base import (Capabilities, ClusterBackend, Failure, FailureKind, Host,
                                    TaskInfo, TaskName, TaskSpec, TaskState, admit_launch,
                                    latest, refuse_fenced_stop, refuse_unknown_stop)
from antdt_tf.backends.k8s_informer import Informer
from antdt_tf.backends.k8s_settings import PORT_OFFSETS, KubernetesSettings, api_client
from antdt_tf.errors import InvalidRequest, StaleGeneration, Unschedulable
from antdt_tf.proto import cluster_pb2 as cpb

log = logging.getLogger(__name__)

GROUP = "antdt.io"
L_JOB, L_ROLE, L_INDEX, L_GENERATION = (f"{GROUP}/job", f"{GROUP}/role", f"{GROUP}/index",
                                        f"{GROUP}/generation")
A_HOST, A_STOP = f"{GROUP}/host", f"{GROUP}/stop-requested"
HOSTNAME_LABEL = "kubernetes.io/hostname"
POD_IP_ENV = "ANTDT_POD_IP"
_ROLE_SHORT = {"ps": "ps", "worker": "worker", "chief": "chief", "master": "master"}


def _unix(stamp) -> float:
    if not stamp:
        return 0.0
    if hasattr(stamp, "timestamp"):
        return stamp.timestamp()
    return float(calendar.timegm(time.strptime(str(stamp)[:19], "%Y-%m-%dT%H:%M:%S")))


def _node_ready(node: Optional[dict]) -> bool:
    """The node's kubelet reports Ready (a cordoned node is still alive)."""
    if node is None:
        return False
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _node_address(node: dict) -> str:
    addresses = (node.get("status") or {}).get("addresses") or []
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        for a in addresses:
            if a.get("type") == kind:
                return a.get("address", "")
    return node["metadata"]["name"]


def memory_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity (``Mi`` when whole, else bytes)."""
    return f"{n >> 20}Mi" if n % (1 << 20) == 0 else str(n)


class KubernetesBackend(ClusterBackend):
    """The tasks of one job (``settings.job``) as pods in ``settings.namespace``."""

    capabilities = Capabilities(stable_endpoints=True, host_pinning=True,
                                fault_injection=False)

    def __init__(self, settings: KubernetesSettings, client=None, kubeconfig: str = "",
                 watch_seconds: int = 60):
        """``client``: a ``kubernetes.client.ApiClient`` (default: :func:`api_client`)."""
        from kubernetes import client as k8s

        self.settings = s = settings
        self.api = client if client is not None else api_client(kubeconfig)
        self.core = k8s.CoreV1Api(self.api)
        self._lock = threading.RLock()
        self._gone: dict[str, dict] = {}          # pod name -> its last state (deleted)
        self._stopping: set[str] = set()          # pods this backend deleted on request
        self._pending_since: dict[str, float] = {}
        self._failed: dict[str, Failure] = {}     # pods this backend failed (deleted)
        self.paths = PathPolicy((s.mount_path,), (s.mount_path,))
        self._anchor = self._job_anchor()
        selector = f"{L_JOB}={s.job}"
        self.pods = Informer("pods", self.core.list_namespaced_pod,
                              {"namespace": s.namespace, "label_selector": selector},
                              s.resync_seconds, self._on_pod_deleted, watch_seconds)
        node_kwargs = {}
        if s.node_selector:
            node_kwargs["label_selector"] = ",".join(f"{k}={v}" for k, v in s.node_selector)
        self.nodes = Informer("nodes", self.core.list_node, node_kwargs, s.resync_seconds,
                               None, watch_seconds)

    # ------------------------------------------------------------------ names

    def service_name(self, job: str, index: int) -> str:
        return f"antdt-{self.settings.job}-{_ROLE_SHORT[job]}-{index}"

    def pod_name(self, name: TaskName) -> str:
        return f"{self.service_name(name.job, name.index)}-g{name.generation}"

    @staticmethod
    def _task_name(pod: dict) -> Optional[TaskName]:
        labels = pod["metadata"].get("labels") or {}
        try:
            return TaskName(labels[L_ROLE], int(labels[L_INDEX]), int(labels[L_GENERATION]))
        except (KeyError, ValueError):
            return None

    # ------------------------------------------------------------------ the job anchor

    def _job_anchor(self) -> dict:
        """The job's ConfigMap (created once): owner of every pod and Service of the job,
        and the newest generation of every task (fencing across master restarts)."""
        from kubernetes.client.rest import ApiException

        s = self.settings
        name = f"antdt-job-{s.job}"
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": s.namespace,
                             "labels": {"app.kubernetes.io/name": "antdt-tf",
                                        "app.kubernetes.io/component": "job", L_JOB: s.job}},
                "data": {}}
        try:
            return self._json(self.core.create_namespaced_config_map(
                s.namespace, body, _preload_content=False))
        except ApiException as e:
            if e.status != 409:
                raise
        return self._json(self.core.read_namespaced_config_map(name, s.namespace,
                                                               _preload_content=False))

    @staticmethod
    def _json(resp) -> dict:
        return json.loads(resp.data)

    def _generation_mark(self, key: tuple[str, int]) -> int:
        return int(((self._anchor.get("data") or {}).get(f"{key[0]}.{key[1]}")) or 0)

    def _raise_mark(self, name: TaskName) -> None:
        if self._generation_mark(name.key) >= name.generation:
            return
        s = self.settings
        self._anchor = self._json(self.core.patch_namespaced_config_map(
            f"antdt-job-{s.job}", s.namespace,
            {"data": {f"{name.job}.{name.index}": str(name.generation)}},
            _preload_content=False))

    def _owner(self) -> list:
        m = self._anchor["metadata"]
        return [{"apiVersion": "v1", "kind": "ConfigMap", "name": m["name"], "uid": m["uid"],
                 "blockOwnerDeletion": False}]

    # ------------------------------------------------------------------ hosts

    def port(self, job: str, index: int) -> int:
        s = self.settings
        if not s.distinct_ports:
            return s.tf_port
        if index >= 200:
            raise Unschedulable(f"{job}:{index}: distinct_ports gives each role 200 ports")
        return s.tf_port + PORT_OFFSETS[job] + index

    def hosts(self) -> list[Host]:
        first = self.settings.tf_port
        last = first + (599 if self.settings.distinct_ports else 0)
        return sorted((Host(n["metadata"]["name"], _node_address(n), first, last)
                       for n in self.nodes.all()
                       if _node_ready(n) and not (n.get("spec") or {}).get("unschedulable")),
                      key=lambda h: h.name)

    def endpoint(self, job: str, index: int, host: str) -> str:
        """The task's Service DNS name: the same on every node."""
        s = self.settings
        return (f"{self.service_name(job, index)}.{s.namespace}.svc.{s.cluster_domain}:"
                f"{self.port(job, index)}")

    # ------------------------------------------------------------------ task states

    def _on_pod_deleted(self, pod: dict) -> None:
        with self._lock:
            self._gone[pod["metadata"]["name"]] = pod

    def _info(self, pod: dict, deleted: bool = False) -> TaskInfo:
        name = self._task_name(pod)
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        pod_name = meta["name"]
        host = spec.get("nodeName") or (meta.get("annotations") or {}).get(A_HOST, "")
        endpoint = self.endpoint(name.job, name.index, host)
        cs = (status.get("containerStatuses") or [{}])[0]
        state = cs.get("state") or {}
        running, terminated = state.get("running"), state.get("terminated")
        started = _unix((running or terminated or {}).get("startedAt")
                        or status.get("startTime"))
        ended = _unix((terminated or {}).get("finishedAt"))
        base = dict(name=name, host=host, endpoint=endpoint, started_unix=started,
                    uid=meta.get("uid", ""))
        stop_requested = (pod_name in self._stopping
                          or (meta.get("annotations") or {}).get(A_STOP) == "true")
        phase = status.get("phase", "Pending")
        failed = self._failed.get(pod_name)
        if failed is not None:
            return TaskInfo(**base, state=TaskState.FAILED, failure=failed,
                            ended_unix=ended or time.time())
        if phase == "Succeeded":
            return TaskInfo(**base, state=(TaskState.STOPPED if stop_requested
                                           else TaskState.SUCCEEDED), ended_unix=ended)
        if phase == "Failed":
            if stop_requested:
                return TaskInfo(**base, state=TaskState.STOPPED, ended_unix=ended)
            return TaskInfo(**base, state=TaskState.FAILED, ended_unix=ended,
                            failure=self._failure(status, terminated))
        # Pending or Running
        if deleted:
            if stop_requested:
                return TaskInfo(**base, state=TaskState.STOPPED, ended_unix=time.time())
            return TaskInfo(**base, state=TaskState.FAILED, ended_unix=time.time(),
                            failure=Failure(FailureKind.KILLED, -9,
                                            f"pod {pod_name} was deleted by someone else"))
        return TaskInfo(**base, state=TaskState.RUNNING)

    @staticmethod
    def _failure(status: dict, terminated: Optional[dict]) -> Failure:
        reason, message = status.get("reason", ""), status.get("message", "")
        if reason == "Evicted":
            kind = (FailureKind.OUT_OF_MEMORY if "memory" in message.lower()
                    else FailureKind.KILLED)
            return Failure(kind, -9, f"evicted by the kubelet: {message}"[:300])
        if reason in ("NodeLost", "Shutdown", "Terminated", "NodeShutdown"):
            return Failure(FailureKind.HOST_LOST, 0, f"{reason}: {message}"[:300])
        if terminated is None:
            return Failure(FailureKind.EXITED, 0, f"pod failed: {reason} {message}"[:300])
        code = int(terminated.get("exitCode") or 0)
        why = terminated.get("reason", "")
        if why == "OOMKilled":
            return Failure(FailureKind.OUT_OF_MEMORY, -9, "OOMKilled")
        signal = int(terminated.get("signal") or 0)
        if not signal and 128 < code <= 128 + 64:
            signal = code - 128      # what container runtimes report for a signal
        if signal:
            return Failure(FailureKind.KILLED, -signal, why)
        return Failure(FailureKind.EXITED, code, why if why not in ("Error", "") else "")

    def _check_health(self, pod: dict) -> None:
        """Fails a live pod whose node is lost or that cannot be scheduled, deleting it
        at once (so nothing it does later counts)."""
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        pod_name = meta["name"]
        if status.get("phase") not in ("Pending", "Running", None) or pod_name in self._failed:
            return
        node = spec.get("nodeName")
        failure = None
        if node:
            self._pending_since.pop(pod_name, None)
            if not _node_ready(self.nodes.get(node)):
                failure = Failure(FailureKind.HOST_LOST, 0, f"node {node} is not Ready")
        else:
            unschedulable = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                                and c.get("reason") == "Unschedulable"
                                for c in status.get("conditions") or [])
            if unschedulable:
                since = self._pending_since.setdefault(pod_name, time.monotonic())
                if time.monotonic() - since > self.settings.unschedulable_seconds:
                    msg = next((c.get("message", "") for c in status.get("conditions") or []
                                if c.get("type") == "PodScheduled"), "")
                    failure = Failure(FailureKind.UNSCHEDULABLE, 0, msg[:300])
        if failure is not None:
            with self._lock:
                self._failed[pod_name] = failure
            log.warning("[k8s] %s: %s; deleting it", pod_name, failure)
            self._delete_pod(pod_name, 0)

    def _all_infos(self) -> dict[TaskName, TaskInfo]:
        out: dict[TaskName, TaskInfo] = {}
        live = self.pods.all()
        for pod in live:
            if self._task_name(pod) is not None:
                self._check_health(pod)
        with self._lock:
            gone = dict(self._gone)
        for pod in live:
            name = self._task_name(pod)
            if name is not None:
                out[name] = self._info(pod)
        for pod_name, pod in gone.items():
            name = self._task_name(pod)
            if name is not None and name not in out:
                out[name] = self._info(pod, deleted=True)
        return out

    def tasks(self) -> dict[tuple[str, int], TaskInfo]:
        return latest(list(self._all_infos().values()))

    def launch_info(self, name: TaskName) -> Optional[TaskInfo]:
        return self._all_infos().get(name)

    def launches_by_task(self) -> dict[tuple[str, int], list[TaskInfo]]:
        out: dict[tuple[str, int], list[TaskInfo]] = {}
        for name, info in self._all_infos().items():
            out.setdefault(name.key, []).append(info)
        return out

    # ------------------------------------------------------------------ launch / stop

    def launch(self, spec: TaskSpec, host: str, allow_overlap: bool = False) -> TaskInfo:
        from kubernetes.client.rest import ApiException

        name = spec.name
        if name.job == "master":
            raise InvalidRequest("the master is not launched by its own backend")
        mark = self._generation_mark(name.key)
        known = self.tasks().get(name.key)
        if name.generation < mark and (known is None or known.name.generation <= mark):
            raise StaleGeneration(f"launch of {name}: generation {mark} of the task was "
                                  f"launched before (job ConfigMap antdt-job-"
                                  f"{self.settings.job})")
        same = admit_launch(known, spec, host, allow_overlap)
        if same is not None:
            return same
        if name.generation == mark and known is None:
            raise StaleGeneration(f"{name} was launched before and its pod is gone; launch "
                                  "the next generation")
        if host not in {h.name for h in self.hosts()}:
            raise Unschedulable(f"{host!r} is not a Ready node of the job (Ready: "
                                f"{[h.name for h in self.hosts()] or 'none'})")
        pod = self.pod_body(spec, host)
        self._raise_mark(name)
        self._ensure_service(name.job, name.index)
        try:
            created = self._json(self.core.create_namespaced_pod(
                self.settings.namespace, pod, _preload_content=False))
        except ApiException as e:
            if e.status != 409:
                raise InvalidRequest(f"the API server refused pod {pod['metadata']['name']}: "
                                     f"{e.status} {_api_message(e)}") from e
            created = self._json(self.core.read_namespaced_pod(
                pod["metadata"]["name"], self.settings.namespace, _preload_content=False))
        self.pods.put(created)
        return self._info(created)

    def pod_body(self, spec: TaskSpec, host: str) -> dict:
        """The pod of one launch (public so a test can validate it against the schema)."""
        s = self.settings
        name = spec.name
        request = start_request(name.job, name.index, spec.program, spec.args,
                                name.generation, spec.endpoint, spec.memory_limit_bytes)
        # a task that serves binds the pod's own IP (the Service name is not the pod's)
        command = command_for(request, self.paths, bind_host=f"$({POD_IP_ENV})")
        if command.estimator:
            raise InvalidRequest("TF1 Estimator tasks need the TF 2.15 image; the Kubernetes "
                                 "backend runs TF 2.21 programs only for now")
        argv = list(command.argv)
        env = [{"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
               {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}]
        env += [{"name": k, "value": v} for k, v in command.env]
        if s.token_secret:
            env.append({"name": "ANTDT_JOB_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": s.token_secret, "key": "token"}}})
        mounts, volumes = [], []
        if s.volume_claim:
            mounts.append({"name": "job", "mountPath": s.mount_path})
            volumes.append({"name": "job", "persistentVolumeClaim": {
                "claimName": s.volume_claim}})
        if s.tls_secret:
            mounts.append({"name": "tls", "mountPath": "/etc/antdt/tls", "readOnly": True})
            volumes.append({"name": "tls", "secret": {"secretName": s.tls_secret}})
            env += [{"name": "ANTDT_TLS_CERT", "value": "/etc/antdt/tls/job.crt"},
                    {"name": "ANTDT_TLS_KEY", "value": "/etc/antdt/tls/job.key"},
                    {"name": "ANTDT_TLS_CA", "value": "/etc/antdt/tls/ca.crt"}]
            if s.tls_server_name:
                env.append({"name": "ANTDT_TLS_SERVER_NAME", "value": s.tls_server_name})
        resources: dict = {}
        if spec.memory_limit_bytes:
            resources["limits"] = {"memory": memory_quantity(spec.memory_limit_bytes)}
        requests = {k: v for k, v in (("cpu", s.cpu_request), ("memory", s.memory_request))
                    if v}
        if requests:
            resources["requests"] = requests
        port = self.port(name.job, name.index)
        container = {"name": "task", "image": s.image, "imagePullPolicy": s.image_pull_policy,
                     "command": ["python", "-m", command.module], "args": argv, "env": env,
                     "ports": [{"name": "tf", "containerPort": port}],
                     "volumeMounts": mounts}
        if resources:
            container["resources"] = resources
        if spec.program in (cpb.TF_SERVER, cpb.PROBE_TASK):
            # in the Service's DNS once it serves: a standby that waits to take over a
            # moved task's address is not named before the old one is gone
            container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1,
                                           "failureThreshold": 1}
        labels = {"app.kubernetes.io/name": "antdt-tf", "app.kubernetes.io/component": "task",
                  L_JOB: s.job, L_ROLE: name.job, L_INDEX: str(name.index),
                  L_GENERATION: str(name.generation)}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.pod_name(name), "namespace": s.namespace,
                         "labels": labels, "annotations": {A_HOST: host},
                         "ownerReferences": self._owner()},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": s.service_account,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": s.termination_grace_seconds,
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": HOSTNAME_LABEL, "operator": "In", "values": [host]}]}]}}},
                "containers": [container],
                "volumes": volumes,
            }}

    def service_body(self, job: str, index: int) -> dict:
        s = self.settings
        return {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": self.service_name(job, index), "namespace": s.namespace,
                         "labels": {"app.kubernetes.io/name": "antdt-tf", L_JOB: s.job,
                                    L_ROLE: job, L_INDEX: str(index)},
                         "ownerReferences": self._owner()},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": False,
                     "selector": {L_JOB: s.job, L_ROLE: job, L_INDEX: str(index)},
                     "ports": [{"name": "tf", "port": self.port(job, index),
                                "targetPort": self.port(job, index)}]}}

    def _ensure_service(self, job: str, index: int) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.create_namespaced_service(self.settings.namespace,
                                                self.service_body(job, index),
                                                _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise InvalidRequest(f"the API server refused Service "
                                     f"{self.service_name(job, index)}: {e.status} "
                                     f"{_api_message(e)}") from e

    def _delete_pod(self, pod_name: str, grace: int) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.delete_namespaced_pod(pod_name, self.settings.namespace,
                                            grace_period_seconds=grace,
                                            _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise

    def stop(self, name: TaskName, kill: bool = False, grace_seconds: float = 10.0) -> TaskInfo:
        from kubernetes.client.rest import ApiException

        infos = self._all_infos()
        info = infos.get(name)
        if info is None:
            refuse_unknown_stop(name, latest(list(infos.values())).get(name.key),
                                f"no pod of {name} in namespace {self.settings.namespace}")
        refuse_fenced_stop(name, info, infos)
        if not info.running:
            return info
        pod_name = self.pod_name(name)
        with self._lock:
            self._stopping.add(pod_name)
        try:       # the intent survives a master restart
            self.core.patch_namespaced_pod(pod_name, self.settings.namespace,
                                           {"metadata": {"annotations": {A_STOP: "true"}}},
                                           _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise
        node_ok = _node_ready(self.nodes.get(info.host)) if info.host else True
        grace = 0 if kill or not node_ok else max(1, math.ceil(grace_seconds))
        self._delete_pod(pod_name, grace)
        deadline = time.monotonic() + grace + 30
        while time.monotonic() < deadline:
            now = self._all_infos().get(name)
            if now is None or not now.running:
                return now or dataclasses.replace(info, state=TaskState.STOPPED)
            if self.pods.get(pod_name) is None:
                break
            time.sleep(0.1)
        # the pod did not go (its kubelet does not answer): take it from the API
        self._delete_pod(pod_name, 0)
        with self._lock:
            pod = self._gone.get(pod_name) or self.pods.get(pod_name)
        return self._info(pod, deleted=True) if pod else dataclasses.replace(
            info, state=TaskState.STOPPED)

    def release_all(self) -> None:
        """Deletes the job's ConfigMap: Kubernetes' garbage collector deletes every pod and
        Service of the job with it (the end of a job)."""
        from kubernetes.client.rest import ApiException

        s = self.settings
        for pod in self.pods.all():
            with self._lock:
                self._stopping.add(pod["metadata"]["name"])
        try:
            self.core.delete_namespaced_config_map(f"antdt-job-{s.job}", s.namespace,
                                                   propagation_policy="Background",
                                                   _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise

    def close(self) -> None:
        self.pods.close()
        self.nodes.close()
        self.api.close()


def _api_message(e) -> str:
    try:
        return json.loads(e.body).get("message", "")[:500]
    except (TypeError, ValueError, AttributeError):
        return str(e.reason)
