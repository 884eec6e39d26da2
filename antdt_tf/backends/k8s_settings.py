"""How the master reaches the cluster and creates a job's pods: the Kubernetes
backend's settings (``antdt-master --kubernetes_*``) and its API client. No
``kubernetes`` import until a client is made."""

from __future__ import annotations

import dataclasses
import os
import re

_JOB_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?\Z")
PORT_OFFSETS = {"ps": 0, "worker": 200, "chief": 400}     # distinct_ports: 200 of each


@dataclasses.dataclass(frozen=True)
class KubernetesSettings:
    """How the master creates the job's pods (``antdt-master --kubernetes_*``).

    ``job``: the job's name in the namespace (a DNS label part, at most 30 characters);
    ``image``: the antdt-tf image every task runs; ``volume_claim``: the PVC mounted in
    every task pod at ``mount_path`` (the job's data, checkpoints and logs: every path a
    task is given must lie under it); ``token_secret``: the Secret (key ``token``) task
    pods take ``ANTDT_JOB_TOKEN`` from; ``tls_secret``: the Secret (``job.crt``,
    ``job.key``, ``ca.crt``: ``auth.make_job_ca``'s files) mounted when the job uses TLS; ``node_selector``: the nodes
    that are the job's hosts (e.g. a node pool's label); ``distinct_ports``: every task
    its own port (``tf_port`` + ``PORT_OFFSETS[role]`` + index) instead of ``tf_port``
    for all, for pods that share one network (``hostNetwork`` pods, the test fake)."""
    namespace: str
    job: str = "antdt"
    image: str = "antdt-tf:latest"
    image_pull_policy: str = "IfNotPresent"
    service_account: str = "antdt-task"
    volume_claim: str = ""
    mount_path: str = "/antdt"
    token_secret: str = ""
    tls_secret: str = ""
    tls_server_name: str = ""
    tf_port: int = 2222
    distinct_ports: bool = False
    cluster_domain: str = "cluster.local"
    node_selector: tuple = ()            # ((label, value), ...)
    cpu_request: str = ""
    memory_request: str = ""
    termination_grace_seconds: int = 30
    unschedulable_seconds: float = 60.0
    resync_seconds: float = 300.0

    def __post_init__(self):
        if not self.namespace:
            raise ValueError("the Kubernetes backend needs a namespace")
        if not _JOB_NAME.match(self.job):
            raise ValueError(f"job name {self.job!r} must be lower-case letters, digits and "
                             "'-', at most 30 characters, starting and ending alphanumeric "
                             "(it is part of every pod's and Service's DNS name)")
        if not 1 <= self.tf_port <= 65535 - (600 if self.distinct_ports else 0):
            raise ValueError(f"tf_port must be a TCP port, got {self.tf_port}")
        if not os.path.isabs(self.mount_path):
            raise ValueError(f"mount_path must be absolute, got {self.mount_path!r}")


def in_cluster_namespace() -> str:
    """The namespace of the pod this process runs in ('' outside a cluster)."""
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def api_client(kubeconfig: str = ""):
    """A ``kubernetes.client.ApiClient``: in-cluster (the pod's service account) when
    running in a pod and no kubeconfig is named, else from ``kubeconfig`` (default: the
    usual ``~/.kube/config`` / ``$KUBECONFIG``)."""
    from kubernetes import client, config

    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    return config.new_client_from_config(config_file=kubeconfig or None)
