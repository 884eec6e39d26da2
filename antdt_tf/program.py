"""The contract between antdt-tf and a job's own training program (docs/program.md).

The agent that starts a program gives it the job through its environment, the same on
every backend, so a program moves from one machine to hosts, Ray or Kubernetes without
an edit:

- ``TF_CONFIG``: the cluster (every task's address) and this task (``chief`` of a
  ParameterServerStrategy job; a TF1 ``worker`` -- worker 0 is the chief -- or, for
  ``tf.estimator``, ``chief``/``worker``/``ps`` as Estimator reads them).
- ``ANTDT_*`` (:data:`ENV`): the master's address, the dataset, the checkpoint directory
  and how often to checkpoint, where to write a summary, the task's role, index and
  generation, the worker slots, whether the job audits records.
- The job's token and TLS files (``ANTDT_JOB_TOKEN``, ``ANTDT_TLS_*``), inherited from
  the agent: every antdt-tf client reads them itself.

Exit codes: 0 the program finished; :data:`RESTART_ME` (75, EX_TEMPFAIL) a task of its
cluster (a PS, the master) was lost -- start me again once it is back, which does not
count against ``--max_restarts``; anything else a failure (restarted up to
``--max_restarts``). :func:`run` gives a ``main`` these exits.

Pure Python: TensorFlow is imported only by :meth:`Context.cluster_resolver`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Callable, Optional

RESTART_ME = 75
# antdt-tf's own start-up of a TF1 worker that moves hosts (not part of the contract)
STANDBY_FILE_ENV = "ANTDT_STANDBY_FILE"
STANDBY_ADDRESS_ENV = "ANTDT_STANDBY_ADDRESS"

# contract field -> environment variable
ENV = {
    "master": "ANTDT_MASTER",
    "dataset": "ANTDT_DATASET",
    "checkpoint_dir": "ANTDT_CHECKPOINT_DIR",
    "checkpoint_every_seconds": "ANTDT_CHECKPOINT_EVERY_SECONDS",
    "report_json": "ANTDT_REPORT_JSON",
    "api": "ANTDT_API",
    "role": "ANTDT_ROLE",
    "index": "ANTDT_TASK_INDEX",
    "generation": "ANTDT_GENERATION",
    "worker_slots": "ANTDT_WORKER_SLOTS",
    "audit": "ANTDT_AUDIT",
}


@dataclasses.dataclass(frozen=True)
class Context:
    """What antdt-tf tells a program about its job (:func:`context`)."""
    master: str
    dataset: str
    checkpoint_dir: str
    checkpoint_every_seconds: float
    report_json: str
    api: str
    role: str
    index: int
    generation: int
    worker_slots: int
    audit: bool
    tf_config: dict

    @property
    def cluster(self) -> dict:
        """``{"chief": [...], "ps": [...], "worker": [...]}`` (TF1: ``ps`` and ``worker``)."""
        return dict(self.tf_config.get("cluster", {}))

    @property
    def is_chief(self) -> bool:
        """The task that writes checkpoints and the summary: the PSS chief, TF1 worker 0."""
        return self.role == "chief" or (self.role == "worker" and self.index == 0
                                        and self.api == "mts")

    def cluster_resolver(self):
        """A ``tf.distribute.cluster_resolver`` for ``ParameterServerStrategy`` (the
        task is the chief, ``rpc_layer`` grpc)."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.cluster), rpc_layer="grpc",
            task_type=self.tf_config.get("task", {}).get("type", self.role),
            task_id=self.tf_config.get("task", {}).get("index", self.index))

    def write_report(self, report: dict) -> None:
        """The program's own summary (e.g. ``{"audit": ...}``), for the job's report; a
        no-op when the job gives no path. Written whole (a reader never sees half)."""
        if not self.report_json:
            return
        tmp = f"{self.report_json}.tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=2)
        os.replace(tmp, self.report_json)


class NotAJobTask(RuntimeError):
    """The process was not started by antdt-tf (no ``ANTDT_MASTER``)."""


def context(environ: Optional[dict] = None) -> Context:
    """This task's :class:`Context`, from the environment the agent set; NotAJobTask
    when it was not started as a task of an antdt-tf job."""
    env = os.environ if environ is None else environ
    if not env.get(ENV["master"]):
        raise NotAJobTask(f"{ENV['master']} is not set: run this program with "
                          "antdt-launch --program (docs/program.md)")

    def get(field: str, default: str = "") -> str:
        return env.get(ENV[field], default)

    return Context(
        master=get("master"), dataset=get("dataset", "train"),
        checkpoint_dir=get("checkpoint_dir"),
        checkpoint_every_seconds=float(get("checkpoint_every_seconds", "10") or 10),
        report_json=get("report_json"), api=get("api"), role=get("role"),
        index=int(get("index", "0") or 0), generation=int(get("generation", "0") or 0),
        worker_slots=int(get("worker_slots", "0") or 0), audit=get("audit") == "1",
        tf_config=json.loads(env.get("TF_CONFIG") or "{}"))


def environment(ctx: Context) -> dict:
    """The environment variables that give a program ``ctx`` (the agent's side)."""
    out = {ENV[f.name]: _text(getattr(ctx, f.name)) for f in dataclasses.fields(Context)
           if f.name in ENV}
    out["TF_CONFIG"] = json.dumps(ctx.tf_config, sort_keys=True)
    return out


def _text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _cluster_unavailable(e: BaseException) -> bool:
    """TensorFlow's word for a lost PS or worker (imported only if the program did)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(e, tf.errors.UnavailableError)


def run(main: Callable[[], Optional[int]]) -> None:
    """Runs ``main()`` and exits with the contract's codes: its return value (None: 0),
    :data:`RESTART_ME` when TensorFlow says a cluster task is unavailable (a PS or the
    master was lost: the job starts this program again once it is back)."""
    try:
        code = main()
    except Exception as e:  # noqa: BLE001 (the program's top level: the exit code says)
        if _cluster_unavailable(e):
            print(f"[antdt program] a cluster task is unavailable, restart me: {e}",
                  file=sys.stderr, flush=True)
            sys.stderr.flush()
            os._exit(RESTART_ME)
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))
