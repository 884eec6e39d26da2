"""A stateful fake of a Kubernetes cluster for the Kubernetes backend's tests.

No Kubernetes API server can run on this project's test machine, so the backend's
conformance suite runs against this: an HTTP server on 127.0.0.1 that speaks the core/v1
REST API the unmodified ``kubernetes`` client calls (pods, services, config maps,
nodes; list, watch with resource versions, create, patch, delete with grace periods,
owner-reference garbage collection, ``410 Gone`` after :meth:`FakeCluster.compact`,
schema validation of every object against the Kubernetes OpenAPI schemas), and a fake
kubelet that runs every pod as a real process (``kubelet.py`` says what it does and
does not). It imports nothing of antdt_tf: it is the cluster, not the backend.

    with FakeCluster(nodes=["n0", "n1"]) as fake:
        client = fake.api_client()          # kubernetes.client.ApiClient
        fake.kill_container("ns", "pod", 9); fake.lose_node("n1"); fake.drop_watches()
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import threading
from typing import Optional

from kubefake.kubelet import Kubelets, pod_dns_available
from kubefake.server import ApiServer
from kubefake.store import Store

__all__ = ["FakeCluster", "pod_dns_available"]


class FakeCluster:
    def __init__(self, nodes=("n0", "n1", "n2"), eviction_seconds: float = 2.0,
                 pod_dns: bool = False, validate: bool = True):
        """``pod_dns``: every pod's /etc/hosts is the cluster DNS (root only:
        :func:`pod_dns_available`); ``eviction_seconds``: how long after a node is lost
        its pods are marked for deletion."""
        self.workdir = tempfile.mkdtemp(prefix="kubefake-")
        self.token = secrets.token_hex(16)
        self.store = Store(validate=validate)
        self.kubelets = Kubelets(self.store, list(nodes), self.workdir, eviction_seconds,
                                 pod_dns)
        self.server = ApiServer(self.store, self.token)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="kubefake-api")
        self._thread.start()
        self.kubeconfig_path = f"{self.workdir}/kubeconfig"
        with open(self.kubeconfig_path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                       "clusters": [{"name": "fake", "cluster": {"server": self.server.url}}],
                       "users": [{"name": "fake", "user": {"token": self.token}}],
                       "contexts": [{"name": "fake", "context": {
                           "cluster": "fake", "user": "fake", "namespace": "default"}}]}, f)

    def api_client(self):
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig_path)

    # -------------------------------------------------------------- faults

    def lose_node(self, name: str) -> None:
        """The machine dies: its processes are SIGKILLed, the node goes NotReady."""
        self.kubelets.lose_node(name)

    def slow_node(self, name: str, factor: float) -> None:
        """A busy neighbour: every container on node ``name`` runs at 1/``factor``."""
        self.kubelets.slow_node(name, factor)

    def kill_container(self, namespace: str, pod: str, sig: int = 9) -> None:
        self.kubelets.kill(namespace, pod, sig)

    def evict(self, namespace: str, pod: str,
              message: str = "The node was low on resource: memory.") -> None:
        self.kubelets.evict(namespace, pod, message)

    def drop_watches(self) -> None:
        self.server.drop_watches()

    def compact(self) -> None:
        """Forgets the event history, as etcd's compaction does. Every node posts a
        heartbeat first (as kubelets do every few seconds), so a watcher of anything
        else last saw an older version than the compacted one: resumed, it gets
        ``410 Gone`` and must list again."""
        from kubefake.store import now

        for node in self.objects("nodes"):
            def beat(obj):
                for c in obj["status"]["conditions"]:
                    c["lastHeartbeatTime"] = now()
            self.store.update("nodes", "", node["metadata"]["name"], beat)
        self.store.compact()

    # -------------------------------------------------------------- looking

    def container_pid(self, namespace: str, pod: str) -> Optional[int]:
        return self.kubelets.pid(namespace, pod)

    def resolve(self, host: str) -> Optional[str]:
        return self.kubelets.resolve(host)

    def objects(self, kind: str) -> list[dict]:
        return self.store.list(kind, None)[0]

    # -------------------------------------------------------------- lifetime

    def close(self) -> None:
        self.server.closing = True
        self.server.drop_watches()
        self.server.shutdown()
        self.server.server_close()
        self.kubelets.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
