"""A real multi-node Ray cluster on this machine, for tests: one raylet per node
(``ray.cluster_utils.Cluster``), every node on 127.0.0.1 with token authentication, no
dashboard, and health checks fast enough that a removed node is declared dead in ~2 s.
Nodes are labelled ``antdt-host=h<i>``; ``h0`` is the head (the cluster's GCS: never
lost in a test). The nodes' Ray processes are this test's children; whatever of them
outlives the cluster's shutdown is SIGKILLed by PID."""

from __future__ import annotations

import os
import sys
import time

import pytest

NODE_ARGS = dict(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 << 20,
                 min_worker_port=12000, max_worker_port=12999)


_SESSION_ENV = False


def set_session_env() -> None:
    """Ray's settings for every cluster and driver of this process and its children:
    token authentication, 127.0.0.1 and fast node-death detection. Ray reads them when
    first imported, so this runs before anything imports Ray (tests/conftest.py)."""
    import atexit
    import secrets
    import shutil
    import tempfile

    from antdt_tf.backends.ray_settings import FAST_HEALTH_CHECKS, RAY_ENV

    global _SESSION_ENV
    if _SESSION_ENV:
        return
    if "ray" in sys.modules:
        raise RuntimeError("Ray was imported before its settings were made")
    _SESSION_ENV = True
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")       # short: Ray's socket paths
    os.environ.update(RAY_ENV, **FAST_HEALTH_CHECKS, RAY_AUTH_TOKEN=secrets.token_hex(16),
                      RAY_TMPDIR=tmp)
    atexit.register(shutil.rmtree, tmp, True)


def available() -> tuple[bool, str]:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False, "ray is not installed (pip install 'antdt-tf[ray]')"
    return True, ""


class RayTestCluster:
    """Ray's settings come from the session's environment (tests/conftest.py sets them
    before anything imports Ray)."""

    def __init__(self, num_nodes: int):
        ok, why = available()
        if not ok:
            pytest.skip(why)
        assert os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get("RAY_TMPDIR")
        self.num_nodes = num_nodes
        self.nodes: dict[str, object] = {}
        self.cluster = None

    def __enter__(self) -> "RayTestCluster":
        from ray.cluster_utils import Cluster

        try:
            self.cluster = Cluster(initialize_head=True, head_node_args=dict(
                NODE_ARGS, include_dashboard=False, labels={"antdt-host": "h0"}))
            self.nodes["h0"] = self.cluster.head_node
            for i in range(1, self.num_nodes):
                self.add(f"h{i}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, host: str) -> None:
        """A new node (its own raylet) joins."""
        self.nodes[host] = self.cluster.add_node(**NODE_ARGS, labels={"antdt-host": host})
        self.cluster.wait_for_nodes()

    def lose(self, host: str) -> None:
        """The node's raylet and every Ray process on it die at once (no drain)."""
        self.cluster.remove_node(self.nodes.pop(host), allow_graceful=False)

    def pids(self) -> set[int]:
        """Every process of the cluster's nodes (this test's children, recursively)."""
        import psutil

        return {p.pid for p in psutil.Process().children(recursive=True)}

    def __exit__(self, *exc) -> None:
        import psutil
        import ray

        before = self.pids()
        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        deadline = time.monotonic() + 10
        for pid in before:           # processes the cluster started (workers, actors)
            try:
                p = psutil.Process(pid)
                p.wait(max(0.0, deadline - time.monotonic()))
            except psutil.TimeoutExpired:
                p.kill()
            except psutil.Error:
                pass
