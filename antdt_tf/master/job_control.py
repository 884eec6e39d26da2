"""JobControl: the job the master owns (``antdt.v1.JobService``).

A client submits a typed ``JobSpec`` once; the master persists it in its state dir
(``job.pb``) beside the shard state and runs it — a :class:`~antdt_tf.master.runner.JobRunner`
in a thread of the master process, acting through a cluster backend. The runner's state
that a restart needs (events, restarts, finished actions, injections done, the clocks)
is saved on every event (``job_state.json``). A master started again on the same state
dir resumes a job that was running: the runner adopts the launches the agents run
(generations make it idempotent), so nothing is launched twice. Clients follow the job
with ``GetJob`` (state, events from an index, the report's path).

Job lifecycle::

    (none) --SubmitJob--> RUNNING --the runner returns, audit ok--> SUCCEEDED
                             |     --it raised, or the audit failed--> FAILED
                             '-- master restart: resumed, still RUNNING
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
from typing import Optional

from google.protobuf.message import DecodeError

from antdt_tf.errors import CorruptState, DataError, InvalidRequest, JobConflict, bounded, shown
from antdt_tf.proto import job_pb2 as jpb

log = logging.getLogger(__name__)
SERVICE_NAME = "antdt.v1.JobService"


class JobControl:
    def __init__(self, state_dir: str = "", master_address: str = "",
                 policy_modules: tuple = (), backends: Optional[dict] = None,
                 on_job=None):
        """``policy_modules``: the modules a submitted job may name a policy from
        (``module:Class``); loading one imports it into this master, so its operator
        allows them (``antdt-master --policy_modules``). Presets are always allowed.
        ``backends``: factories of the cluster backends this master's operator configured
        (``{"kubernetes": factory}``); local, agents and ray need none. ``on_job(cfg)``:
        called with the job's configuration before it runs (new or resumed): the master
        applies the job's Monitor settings."""
        self.on_job = on_job
        self.dir = pathlib.Path(state_dir) if state_dir else None
        self.backends = dict(backends or {})
        self.policy_modules = tuple(policy_modules)
        self.master_address = master_address   # set once the server is bound
        self.services = None      # server.MasterServices: set by the server that serves this
        self._lock = threading.Lock()
        self.spec: Optional[jpb.JobSpec] = None
        self.state = jpb.JobStatus.STATE_UNSPECIFIED
        self.message = ""
        self.events: list[jpb.JobEvent] = []
        self.report_path = ""
        self.recoveries = 0
        self._saved: Optional[dict] = None     # the runner state to resume from
        self._runner = None
        self._thread: Optional[threading.Thread] = None
        self._load()

    # ------------------------------------------------------------------ persistence

    def _load(self) -> None:
        if self.dir is None or not (self.dir / "job.pb").exists():
            return
        spec = jpb.JobSpec()
        try:
            spec.ParseFromString((self.dir / "job.pb").read_bytes())
            saved = json.loads((self.dir / "job_state.json").read_text()) if (
                self.dir / "job_state.json").exists() else {}
            events = [jpb.JobEvent(t=e["t"], text=e["text"]) for e in saved.get("events", [])]
        except (OSError, DecodeError, ValueError, KeyError, TypeError) as e:
            raise CorruptState(f"{self.dir}: cannot read the job's spec or state: {e}") from e
        self.spec, self.events = spec, events
        self.state = saved.get("state", jpb.JobStatus.RUNNING)
        self.message = saved.get("message", "")
        self.report_path = saved.get("report_path", "")
        self.recoveries = saved.get("recoveries", 0)
        self._saved = saved.get("runner")

    def _write(self, name: str, data: bytes) -> None:
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f"{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)

    def _save(self) -> None:
        runner = self._runner.saved_state() if self._runner is not None else self._saved
        self._write("job_state.json", json.dumps({
            "state": self.state, "message": self.message, "report_path": self.report_path,
            "recoveries": self.recoveries, "runner": runner,
            "events": [{"t": e.t, "text": e.text} for e in self.events]}).encode())

    # ------------------------------------------------------------------ the job

    def start(self) -> None:
        """Resumes a job that was running when the master stopped (call once serving)."""
        if self.spec is not None and self.state == jpb.JobStatus.RUNNING:
            self.recoveries += 1
            log.warning("[master] resuming the job (recovery %d)", self.recoveries)
            self._spawn(self._saved or {})

    def _spawn(self, resume: Optional[dict]) -> None:
        self._thread = threading.Thread(target=self._run, args=(resume,), name="job-runner",
                                        daemon=True)
        self._thread.start()

    def _run(self, resume: Optional[dict]) -> None:
        from antdt_tf.job.spec import Job
        from antdt_tf.master.runner import JobRunner

        try:
            cfg = Job.of(self.spec)
            if self.on_job is not None:
                self.on_job(cfg)
            if self.services is None:
                raise RuntimeError("the job control is not served by a MasterServer")
            self._runner = JobRunner(cfg, self.master_address, self.services,
                                     on_event=self._on_event,
                                     resume=resume,
                                     backend_factory=self.backends.get(cfg.backend))
            report = self._runner.run()
            path = cfg.workdir / "report.json"
            tmp = path.with_name(f".{path.name}.tmp")       # a reader sees it whole
            tmp.write_text(json.dumps(report, indent=2))
            os.replace(tmp, path)
            ok = report.get("audit", {}).get("ok", True)
            with self._lock:
                self.report_path = str(path)
                self.state = jpb.JobStatus.SUCCEEDED if ok else jpb.JobStatus.FAILED
                self.message = "" if ok else "the audit found records applied off their count"
        except Exception as e:  # noqa: BLE001 (a thread's top level: the job fails, said why)
            log.exception("[master] the job failed")
            with self._lock:
                self.state = jpb.JobStatus.FAILED
                self.message = f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                self._save()

    def _on_event(self, event: Optional[dict]) -> None:
        """A runner event (None: only its state changed): kept, saved."""
        with self._lock:
            if event is not None:
                self.events.append(jpb.JobEvent(t=event["t"], text=event["event"]))
            self._save()

    # ------------------------------------------------------------------ RPCs

    def SubmitJob(self, req: jpb.SubmitJobRequest) -> jpb.JobStatus:
        from antdt_tf.data.records import RecordFile
        from antdt_tf.job.spec import Job

        cfg = Job.of(req.spec)            # InvalidRequest: nothing starts
        if cfg.backend == "kubernetes" and "kubernetes" not in self.backends:
            raise InvalidRequest("JobSpec.backend 'kubernetes': this master does not create "
                                 "pods (start it with --kubernetes_image=...; "
                                 "deploy/kubernetes/master.yaml does)")
        module = cfg.policy.partition(":")[0] if ":" in cfg.policy else ""
        if module and module not in self.policy_modules:
            raise InvalidRequest(
                f"JobSpec.policy {shown(cfg.policy)}: this master imports user policies only "
                "from the modules its operator allowed (antdt-master --policy_modules="
                f"{','.join(self.policy_modules) or '<none>'}); or use a preset")
        if module:      # allowed: what it wants of the data, checked before anything runs
            from antdt_tf.controller import PolicyTraits, load_policy
            from antdt_tf.job.spec import check_traits

            try:
                check_traits(req.spec, PolicyTraits.of(load_policy(cfg.policy)))
            except ValueError as e:
                raise InvalidRequest(bounded(f"JobSpec.policy {shown(cfg.policy)}: {e}")) from e
        with self._lock:
            if self.spec is not None:
                if self.spec == req.spec:
                    return self._status(len(self.events))    # a retried submit
                raise JobConflict("this master runs another job; start a master with its "
                                  "own state dir for a new one")
        for name in ("data", "eval_data"):
            path = getattr(cfg, name)
            if not path:
                continue
            try:
                RecordFile(path)
            except (DataError, OSError, ValueError) as e:
                # the path is quoted once, cut (shown), not in full by the reason
                reason = str(e).replace(path, "it") if path else str(e)
                raise InvalidRequest(bounded(f"JobSpec.{name} {shown(path)}: {reason}")) from e
        try:
            cfg.workdir.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as e:
            raise InvalidRequest(f"JobSpec.workdir {shown(str(cfg.workdir))} cannot be "
                                 f"created: {type(e).__name__}") from e
        with self._lock:
            self._write("job.pb", req.spec.SerializeToString())
            self.spec = jpb.JobSpec()
            self.spec.CopyFrom(req.spec)
            self.state = jpb.JobStatus.RUNNING
            self._save()
        self._spawn(None)
        return self.GetJob(jpb.GetJobRequest())

    def GetJob(self, req: jpb.GetJobRequest) -> jpb.JobStatus:
        if req.events_from < 0:
            raise InvalidRequest(f"events_from must be >= 0, got {req.events_from}")
        with self._lock:
            return self._status(req.events_from)

    def _status(self, events_from: int) -> jpb.JobStatus:
        return jpb.JobStatus(state=self.state, message=self.message,
                             events_total=len(self.events),
                             events=self.events[events_from:], report_path=self.report_path,
                             recoveries=self.recoveries)

    def generic_handler(self):
        import grpc

        from antdt_tf.rpc import unary_handlers

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME, unary_handlers(jpb.DESCRIPTOR.services_by_name["JobService"], self))

