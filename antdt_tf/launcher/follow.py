"""antdt-launch as a client of the master: submit the job, follow it, fetch the report.

- :func:`run_local`: the embedded default. Starts one agent per simulated host on
  loopback (``LocalBackend``) and an ``antdt-master`` process (state in the job's
  workdir) that owns the job; the launcher restarts that master if it dies (and kills it
  for ``kill:master`` injections) — the master then resumes the job from its state dir.
- :func:`follow`: submit a ``JobSpec`` to a master and follow it to the end: the
  progress line, the job's events as they happen, the report.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import signal
import subprocess
import sys
import time
from typing import Optional

import grpc

from antdt_tf import auth
from antdt_tf.errors import AntdtError
from antdt_tf.job.spec import Job
from antdt_tf.proto import job_pb2 as jpb
from antdt_tf.proto import job_pb2_grpc as jpb_grpc

TERMINAL = (jpb.JobStatus.SUCCEEDED, jpb.JobStatus.FAILED)


class JobClient:
    """``antdt.v1.JobService`` of one master."""

    def __init__(self, address: str, timeout: float = 30.0):
        self._channel = auth.channel(address)
        self._stub = jpb_grpc.JobServiceStub(self._channel)
        self.address, self.timeout = address, timeout

    def _call(self, method: str, request, wait: bool = True):
        from antdt_tf.rpc import raise_typed

        try:
            return getattr(self._stub, method)(request, timeout=self.timeout,
                                               wait_for_ready=wait)
        except grpc.RpcError as e:
            raise_typed(e, f"master {self.address} {method}")

    def submit(self, spec: jpb.JobSpec) -> jpb.JobStatus:
        return self._call("SubmitJob", jpb.SubmitJobRequest(spec=spec))

    def get(self, events_from: int = 0, wait: bool = True) -> jpb.JobStatus:
        return self._call("GetJob", jpb.GetJobRequest(events_from=events_from), wait)

    def close(self) -> None:
        self._channel.close()


class _Follower:
    """What the progress line reads (``antdt_tf.launcher.progress.ProgressLine``)."""

    def __init__(self, cfg: Job, num_records: int):
        self.cfg, self.num_records = cfg, num_records
        self.t0 = time.monotonic()
        self.train_t0: Optional[float] = None


class EmbeddedMaster:
    """The ``antdt-master`` process of a local job, restarted on its state dir."""

    def __init__(self, cfg: Job, port: int, tf_rpc_port: int = 0, network=None,
                 bind: str = "127.0.0.1", env: Optional[dict] = None):
        """``network``: the job's PrivateNetwork the master runs in (None: the machine's
        loopback); the launcher then reaches it over a Unix socket. ``bind``: the
        address it serves on (beyond loopback: with the job's token and TLS, which
        ``env`` — the master's whole environment, default this process's — carries)."""
        self.cfg, self.port, self.tf_rpc_port = cfg, port, tf_rpc_port
        self.network, self.bind, self.env = network, bind, env
        self.proc: Optional[subprocess.Popen] = None
        self.restarts = 0
        self.log_path = cfg.workdir / "master.log"
        self.unix_socket = ""
        if network is not None:
            socket = cfg.workdir / "master.sock"
            if len(str(socket)) > 100:      # sun_path holds 108 bytes
                import tempfile

                socket = pathlib.Path(tempfile.mkdtemp(prefix="antdt-")) / "master.sock"
            self.unix_socket = str(socket)

    @property
    def address(self) -> str:
        """Where the job's own processes (in its network) reach the master."""
        return f"{self.bind}:{self.port}"

    @property
    def client_address(self) -> str:
        """Where this launcher reaches it."""
        return f"unix:{self.unix_socket}" if self.unix_socket else self.address

    def start(self, timeout: float = 60.0) -> None:
        from antdt_tf.procutil import child_env, wait_for_port_file

        cfg = self.cfg
        port_file = cfg.workdir / "master.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "antdt_tf.master", f"--port={self.port}",
                f"--bind={self.bind}",
                 f"--port_file={port_file}", f"--state_dir={cfg.workdir / 'master'}",
                 f"--straggler_window_seconds={cfg.straggler_window_seconds}",
                 f"--straggler_slow_ratio={cfg.straggler_slow_ratio}",
                 f"--straggler_persistent_after_seconds="
                 f"{cfg.straggler_persistent_after_seconds}",
                 f"--tf_rpc_port={self.tf_rpc_port}", f"--unix_socket={self.unix_socket}"]
        if ":" in cfg.policy:      # the user's own policy: this master may import it
            argv.append(f"--policy_modules={cfg.policy.partition(':')[0]}")
        if self.network is not None:
            argv = self.network.command(argv)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                env=child_env(self.env))
        wait_for_port_file(self.proc, port_file, timeout, "antdt-master", self.log_path)

    def kill(self) -> int:
        pid = self.proc.pid
        self._signal(signal.SIGKILL)
        self.proc.wait()
        return pid

    def _signal(self, sig) -> None:
        import os

        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()


def follow(cfg: Job, master: str, embedded: Optional[EmbeddedMaster] = None,
           show_progress: bool = True) -> dict:
    """Submits ``cfg`` to ``master`` and follows the job to its end; returns the report
    (with the embedded master's own failures and restarts added)."""
    from antdt_tf.launcher.progress import ProgressLine
    from antdt_tf.monitor.client import MonitorClient
    from antdt_tf.sharding.client import ShardingClient

    try:
        num_records = cfg.count_records()
    except (AntdtError, OSError):
        if cfg.backend != "kubernetes":
            raise
        num_records = 0       # on the cluster's volume only: progress without a total
    job = _Follower(cfg, num_records)
    mine: list[dict] = []              # the launcher's own events (the embedded master)
    kills = sorted((j for j in cfg.injections if j.job == "master"),
                   key=lambda j: (j.percent, j.at))
    client = JobClient(master)
    status = client.submit(cfg.spec)
    seen = 0
    deadline = time.monotonic() + cfg.timeout_seconds + 60
    with ShardingClient(master, timeout=10) as admin, MonitorClient(master) as monitor:
        progress = ProgressLine(job, admin, monitor, enabled=show_progress)

        def event(text: str, **extra) -> dict:
            ev = {"t": round(time.monotonic() - job.t0, 2), "event": text, **extra}
            mine.append(ev)
            progress.write(f"[{ev['t']:6.1f}s] {text}")
            return ev
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the job did not finish within {cfg.timeout_seconds:g}s")
                if embedded is not None and embedded.proc.poll() is not None:
                    code = embedded.proc.returncode
                    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
                    embedded.restarts += 1
                    if embedded.restarts > cfg.max_restarts:
                        raise RuntimeError(f"the master failed {embedded.restarts} times "
                                           f"({how}); see {embedded.log_path}")
                    event(f"master:0 {how}; restarting it (restart {embedded.restarts})",
                          task="master:0", failure=how)
                    embedded.start()
                try:
                    status = client.get(seen, wait=False)
                except AntdtError:
                    time.sleep(0.25)       # the master restarting
                    continue
                for e in status.events:
                    progress.write(f"[{e.t:6.1f}s] {e.text}")
                seen = status.events_total
                if status.state in TERMINAL:
                    progress.update(final=True)
                    break
                progress.update()
                if job.train_t0 is None and progress.started:
                    job.train_t0 = time.monotonic()
                if kills and embedded is not None and job.train_t0 is not None:
                    inj = kills[0]
                    done = (100.0 * progress.records / max(1, progress.total) if inj.percent
                            else time.monotonic() - job.train_t0)
                    if done >= inj.at:
                        kills.pop(0)
                        pid = embedded.kill()
                        event(f"injected: SIGKILL {inj.task} (pid {pid})", injected=str(inj))
                time.sleep(0.25)
        finally:
            progress.close()
            client.close()
    if not status.report_path:
        raise RuntimeError(f"the job failed: {status.message}")
    report = json.loads(pathlib.Path(status.report_path).read_text())
    if status.state == jpb.JobStatus.FAILED and not report.get("audit"):
        raise RuntimeError(f"the job failed: {status.message}")
    report["failures"] = sorted(report["failures"] + [e for e in mine if "failure" in e],
                                key=lambda e: e["t"])
    report["events"] = sorted(report["events"] + mine, key=lambda e: e["t"])
    if embedded is not None and embedded.restarts:
        report["restarts"]["master:0"] = embedded.restarts
    report["master_recoveries"] = status.recoveries
    return report


def run_local(cfg: Job, secure: bool = True, isolate: bool = True,
              show_progress: bool = True) -> dict:
    """The whole job on this machine: agents for the simulated hosts, the master, the job.
    ``secure``: a fresh job token and a throw-away CA for this run (unless the caller's
    environment has its own), so a local job is authenticated like one across hosts.
    ``isolate``: the master, the agents and every TF task run in a private network
    namespace where Linux allows it (``antdt_tf.backends.private_network``), so no port
    of the job — TF's unauthenticated servers above all — is reachable from outside."""
    from antdt_tf.backends import private_network
    from antdt_tf.backends.local import LocalBackend
    from antdt_tf.tf.local_cluster import free_ports

    network = None
    if isolate:
        network, why = private_network.create()
        if network is None:
            print(f"antdt-launch: warning: the job's ports stay on this machine's loopback "
                  f"(no private network namespace: {why})", file=sys.stderr)
    # the same tf_rpc port after a master restart: the workers' graphs hold its address
    ports = free_ports(3 + cfg.num_ps + cfg.slots)
    cfg = cfg.replace(addresses={"chief": [f"127.0.0.1:{ports[1]}"],
                                 "ps": [f"127.0.0.1:{p}" for p in ports[3:3 + cfg.num_ps]],
                                 "worker": [f"127.0.0.1:{p}" for p in ports[3 + cfg.num_ps:]]})
    try:
        with (job_security(cfg.workdir / "tls") if secure else contextlib.nullcontext()):
            master = EmbeddedMaster(cfg, ports[0], tf_rpc_port=ports[2], network=network)
            hosts = LocalBackend(cfg.num_hosts, cfg.workdir,
                                 estimator_python=cfg.estimator_python,
                                 master=master.address, job_roots=(cfg.checkpoint_dir,),
                                 read_roots=cfg.read_roots, network=network,
                                 program_roots=cfg.program_roots)
            try:
                master.start()
                return follow(cfg, master.client_address, embedded=master,
                              show_progress=show_progress)
            finally:
                master.stop()
                hosts.shutdown()
    finally:
        if network is not None:
            network.close()


@contextlib.contextmanager
def job_security(tls_dir: pathlib.Path, hosts: tuple = ("127.0.0.1", "localhost")):
    """A job token and a throw-away CA (in ``tls_dir``, its certificate valid for
    ``hosts``) in this process's environment, which every process of the job inherits,
    while the job runs; what the environment already has (the user's own token or
    certificates) is kept."""
    import os
    import secrets

    saved = {k: os.environ.get(k) for k in (auth.TOKEN_ENV, *auth.TLS_ENV.values())}
    try:
        if not os.environ.get(auth.TOKEN_ENV):
            os.environ[auth.TOKEN_ENV] = secrets.token_hex(32)
        if auth.TlsFiles.from_env() is None:
            auth.make_job_ca(tls_dir, hosts).export()
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
