"""``antdt-launch --backend=ray``: a job on a Ray cluster.

Where the master runs: a **detached actor** (``master`` in the job's namespace) pinned to
the cluster's **head node**, supervising the ``antdt-master`` process. The head node,
because a Ray cluster does not outlive its head (its GCS) without GCS fault tolerance
either: a master there adds no new way for the job to die. The master process is a Ray
driver of its own: its job control places the job's tasks as actors
(:class:`~antdt_tf.backends.ray.RayBackend`).

Its state dir is ``<workdir>/master`` (snapshot + journal of the shard state, the job's
spec and runner state), on the disk the head node sees:

- the master process dies (``--inject=kill:master@…``, a crash): the launcher starts it
  again through its actor, on the same state dir and ports; it resumes the job and adopts
  the task actors that still run — they are detached, a master's death does not take
  them along — so nothing is launched twice;
- the launcher dies: the master actor and the job go on to the job's end (the report is
  written to ``<workdir>/report.json``); the idle master actor is then left for the
  user to remove (``ray.kill(ray.get_actor("master", namespace=NS))``, docs/ray.md);
- the head node dies: the Ray cluster is gone, and with it the job.

The launcher, the master and every task run with the job's token and TLS files (made
here unless the environment has the user's own): the master binds the head node's
address, beyond loopback on a real cluster, where it authenticates every caller.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Optional

import ray

from antdt_tf.backends import ray as ray_backend
from antdt_tf.job.spec import Job
from antdt_tf.launcher.follow import EmbeddedMaster, follow, job_security

MASTER_ACTOR = "master"
# the master's own ports: above Ray's worker ports (10002-19999), above the task ports
# (23000-23999) and below the kernel's ephemeral range
MASTER_LOWEST_PORT = 24000


class MasterActor:
    """The job's ``antdt-master`` process, inside a detached actor on the head node."""

    def __init__(self, spec: bytes, job_env: dict, bind: str):
        from antdt_tf.job.spec import Job
        from antdt_tf.proto import job_pb2 as jpb
        from antdt_tf.tf.local_cluster import free_ports

        unknown = set(job_env) - set(ray_backend.JOB_ENV)
        if unknown:
            raise ValueError(f"the master actor takes only the job's {ray_backend.JOB_ENV}")
        os.environ.update(job_env)
        cfg = Job.of(jpb.JobSpec.FromString(spec))
        port, tf_rpc_port = free_ports(2, bind, lowest=MASTER_LOWEST_PORT)
        gcs = ray.get_runtime_context().gcs_address
        self.master = EmbeddedMaster(cfg, port, tf_rpc_port=tf_rpc_port, bind=bind,
                                     env=ray_backend.driver_env(gcs))
        # the master process dies with this actor: it is forked from one long-lived
        # thread (its parent-death signal follows that thread)
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, "antdt-spawn")
        ray_backend.watch_raylet(self._kill_now)

    def _kill_now(self) -> None:
        if self.master.proc is not None and self.master.proc.poll() is None:
            self.master.kill()

    def start(self) -> str:
        self._spawner.submit(self.master.start).result()
        return self.master.address

    def exit_code(self) -> Optional[int]:
        return None if self.master.proc is None else self.master.proc.poll()

    def kill(self) -> int:
        return self.master.kill()

    def stop(self) -> None:
        self.master.stop()


class RayMaster:
    """The launcher's handle on the master actor, shaped like :class:`EmbeddedMaster`
    (``follow`` restarts it through this when its process dies)."""

    def __init__(self, actor, cfg: Job):
        self.actor, self.cfg = actor, cfg
        self.restarts = 0
        self.log_path = cfg.workdir / "master.log"
        self.proc = self               # follow() polls .proc like a Popen
        self.returncode: Optional[int] = None
        self.address = ""

    def start(self, timeout: float = 90.0) -> None:
        self.address = ray.get(self.actor.start.remote(), timeout=timeout)
        self.returncode = None

    def poll(self) -> Optional[int]:
        try:
            self.returncode = ray.get(self.actor.exit_code.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            self.returncode = -9       # its actor is gone (the head node with it)
        return self.returncode

    def kill(self) -> int:
        return ray.get(self.actor.kill.remote(), timeout=30)

    def stop(self) -> None:
        try:
            ray.get(self.actor.stop.remote(), timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass


def _head_node(nodes: list[dict]) -> dict:
    for n in nodes:
        if n["Alive"] and "node:__internal_head__" in n.get("Resources", {}):
            return n
    raise RuntimeError("the Ray cluster has no alive head node")


def run_ray(cfg: Job, address: str = "auto", show_progress: bool = True) -> dict:
    """Submits ``cfg`` to a master actor on the head node of the Ray cluster at
    ``address`` and follows the job to its end; returns the report. ``cfg.num_hosts``
    0: every alive node of the cluster."""
    ray_backend.connect(address, cfg.ray_namespace)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        head = _head_node(nodes)
        if cfg.num_hosts < 1:
            cfg = cfg.replace(num_hosts=len(nodes))
        hosts = tuple(sorted({n["NodeManagerAddress"] for n in nodes}
                             | {"127.0.0.1", "localhost"}))
        with job_security(cfg.workdir / "tls", hosts):
            job_env = {k: os.environ[k] for k in ray_backend.JOB_ENV if os.environ.get(k)}
            actor = ray_backend.remote_class(MasterActor).options(
                name=MASTER_ACTOR, namespace=cfg.ray_namespace, lifetime="detached",
                num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=4,
                scheduling_strategy=ray_backend.pinned(head["NodeID"]),
            ).remote(cfg.spec.SerializeToString(), job_env, head["NodeManagerAddress"])
            master = RayMaster(actor, cfg)
            try:
                master.start()
                return follow(cfg, master.address, embedded=master,
                              show_progress=show_progress)
            finally:
                master.stop()
                ray.kill(actor)
    finally:
        ray.shutdown()
