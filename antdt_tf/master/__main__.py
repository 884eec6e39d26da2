"""antdt-master: the job's master process, serving the sharding service.

Trainers pull shards from it over gRPC (``antdt.v1.ShardingService``); it also serves
the standard gRPC health service (``grpc.health.v1.Health``).

Usage::

    antdt-master --state_dir=/var/lib/antdt/job42 --port=7470

State: with ``--state_dir`` every change is journaled before it is acknowledged, so a
master killed with SIGKILL and started again on the same directory continues exactly
where it stopped (leases held by live trainers stay theirs for one more lease term).
A damaged or incompatible state directory stops the master with exit code 3 and a
message; ``--discard_corrupt_state`` moves the damaged files into
``state_dir/corrupt-<time>/`` and starts fresh. Without ``--state_dir`` the state lives in
memory only.

Network: binds 127.0.0.1 by default. Listening on other interfaces needs an explicit
``--bind`` (e.g. ``--bind=198.18.0.1``) and the job's token (``$ANTDT_JOB_TOKEN`` or
``--token_file``; every call but health checks must carry it, see ``antdt_tf.auth``);
without a token such a bind is refused unless ``--allow_unauthenticated_network_access``.

Jobs: a client (``antdt-launch``) submits a job (``antdt.v1.JobService.SubmitJob``, a
typed ``JobSpec``); the master persists it in ``--state_dir`` and runs it — its tasks
started, supervised, moved and scaled through a cluster backend (the agents that
registered with this master), its injections and the Controller's actions carried out
(``antdt_tf.master.job_control``). Started again on the same state dir, the master
resumes a running job, adopting the tasks that still run.

Signals: SIGTERM/SIGINT go NOT_SERVING on the health service, drain in-flight calls for
``--grace_seconds``, write a final snapshot and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import signal
import sys

from absl import app, flags

from antdt_tf import auth, exitcodes
from antdt_tf.errors import CorruptState, IncompatibleState, StateDirLocked
from antdt_tf.master.server import MasterServer
from antdt_tf.monitor.straggler import StragglerConfig
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.sharding.store import FSYNC_MODES, StateStore, open_state

FLAGS = flags.FLAGS
flags.DEFINE_integer("port", 7470, "TCP port to serve on; 0 picks a free port (see --port_file).")
flags.DEFINE_string("bind", "127.0.0.1", "Address to bind. Default loopback only; any other "
                    "interface must be named explicitly.")
flags.DEFINE_string("port_file", "", "If set, the bound port is written here (atomically) "
                    "once the server is serving.")
flags.DEFINE_string("state_dir", "", "Directory for the durable shard state (snapshot + "
                    "journal). Empty: in memory only, a restart loses the job's data position.")
flags.DEFINE_enum("fsync", "interval", list(FSYNC_MODES), "When the journal is fsynced: every "
                  "event, once a second, or never (a process crash loses nothing in any mode; "
                  "a machine crash may lose up to the interval).")
flags.DEFINE_integer("snapshot_every", 100_000, "Compact the journal into a snapshot after "
                     "this many events.")
flags.DEFINE_string("advertise", "", "The address the job's tasks reach this master at "
                    "(default: --bind; 127.0.0.1 for a wildcard bind).")
flags.DEFINE_boolean("discard_corrupt_state", False, "Move a damaged state_dir aside "
                     "(state_dir/corrupt-<time>/) and start fresh instead of refusing to start.")
flags.DEFINE_float("lease_min_seconds", 30.0, "Shortest lease, whatever the observed speed.")
flags.DEFINE_float("lease_initial_seconds", 600.0, "Lease before any shard time was observed.")
flags.DEFINE_float("lease_max_seconds", 86400.0, "Longest lease.")
flags.DEFINE_float("lease_factor", 4.0, "A lease lasts this many times the expected time of "
                   "its records (from the slower of the holder's and the dataset's observed "
                   "seconds per record).")
flags.DEFINE_float("settle_seconds", 10.0, "How long a lease with sparse reports whose holder "
                   "died or went silent is held for the trainer to settle it from the offset "
                   "recorded on the PS, before it goes back from the master's own count.")
flags.DEFINE_integer("max_shard_failures", 3, "A shard that failed (FAILED, expired lease or "
                     "holder died) this often in one epoch is set aside as poisoned.")
flags.DEFINE_float("grace_seconds", 5.0, "Drain time for in-flight calls on SIGTERM.")
auth.define_server_flags("controls the job")
flags.DEFINE_list("policy_modules", [], "Modules a submitted job may take its Controller "
                  "policy from (module:Class): loading one imports it into this master. "
                  "Presets need none.")
flags.DEFINE_string("unix_socket", "", "Also serve on this Unix socket (same token and "
                    "TLS): how a launcher outside the job's private network namespace "
                    "reaches the master.")
flags.DEFINE_integer("tf_rpc_port", 0, "With TLS: the plaintext port of the workers' "
                     "TensorFlow RPC data path (TF's RPC ops speak no TLS); 0: the one this "
                     "master used before (kept in --state_dir), else any free port. Keep it "
                     "inside the job's private network.")
flags.DEFINE_float("tick_seconds", 0.5, "How often leases are checked for expiry and the "
                   "journal synced.")

flags.DEFINE_float("straggler_window_seconds", StragglerConfig.window_seconds,
                   "Monitor: sliding window of step times (workers) and probe latencies (PS) "
                   "each judgement looks at.")
flags.DEFINE_float("straggler_slow_ratio", StragglerConfig.slow_ratio,
                   "Monitor: a worker is slow when the median worker rate is this many times "
                   "its own; a PS when its latency is this many times the fastest PS's.")
flags.DEFINE_float("straggler_persistent_after_seconds",
                   StragglerConfig.persistent_after_seconds, "Monitor: a slow episode "
                   "shorter than this is transient; longer is persistent (or deterministic when "
                   "the task was never normal).")
flags.DEFINE_integer("straggler_min_samples", StragglerConfig.min_samples,
                     "Monitor: steps/probes in the window before a task is judged.")
flags.DEFINE_string("kubernetes_image", "", "Kubernetes: the antdt-tf image of the job's task "
                    "pods. Set, this master runs jobs submitted with --backend=kubernetes: it "
                    "creates their pods itself (docs/kubernetes.md, deploy/kubernetes/).")
flags.DEFINE_string("kubernetes_namespace", "", "Kubernetes: the namespace of the job's pods "
                    "(default: this master pod's own).")
flags.DEFINE_string("kubernetes_job", "antdt", "Kubernetes: the job's name, part of every "
                    "pod's and Service's name (one master runs one job).")
flags.DEFINE_string("kubernetes_kubeconfig", "", "Kubernetes: a kubeconfig, for a master that "
                    "runs outside the cluster (default: the pod's service account).")
flags.DEFINE_string("kubernetes_volume_claim", "", "Kubernetes: the PersistentVolumeClaim "
                    "mounted in every task pod at --kubernetes_mount_path (data, checkpoints).")
flags.DEFINE_string("kubernetes_mount_path", "/antdt", "Kubernetes: where task pods mount the "
                    "claim; every path a job names must lie under it.")
flags.DEFINE_string("kubernetes_service_account", "antdt-task", "Kubernetes: the task pods' "
                    "service account (it needs no API permission).")
flags.DEFINE_string("kubernetes_token_secret", "", "Kubernetes: the Secret (key 'token') task "
                    "pods take ANTDT_JOB_TOKEN from.")
flags.DEFINE_string("kubernetes_tls_secret", "", "Kubernetes: the Secret (job.crt, job.key, "
                    "ca.crt) mounted in task pods when the job uses TLS.")
flags.DEFINE_integer("kubernetes_tf_port", 2222, "Kubernetes: the TF port of every task pod.")
flags.DEFINE_boolean("kubernetes_distinct_ports", False, "Kubernetes: every task its own TF "
                     "port (--kubernetes_tf_port + 200 per role + index), for pods that share "
                     "one network (hostNetwork pods).")
flags.DEFINE_list("kubernetes_node_selector", [], "Kubernetes: LABEL=VALUE,...: the nodes that "
                  "are the job's hosts (default: every Ready node).")

log = logging.getLogger("antdt.master")
PROGRAM = "antdt-master"


def _straggler_config():
    try:
        return StragglerConfig(window_seconds=FLAGS.straggler_window_seconds,
                               slow_ratio=FLAGS.straggler_slow_ratio,
                               persistent_after_seconds=FLAGS.straggler_persistent_after_seconds,
                               min_samples=FLAGS.straggler_min_samples)
    except ValueError as e:
        raise app.UsageError(f"bad straggler flags: {e}") from e


def _job_monitor_settings(view):
    """``on_job`` for JobControl: the submitted job's straggler settings (what
    ``antdt-launch --straggler_*`` says) for the Monitor, except those this master's
    operator gave explicitly (``antdt-master --straggler_*``), which win."""
    def apply(cfg) -> None:
        mine = _straggler_config()
        values = {}
        for field, flag in (("window_seconds", "straggler_window_seconds"),
                            ("slow_ratio", "straggler_slow_ratio"),
                            ("persistent_after_seconds", "straggler_persistent_after_seconds")):
            values[field] = (getattr(mine, field) if FLAGS[flag].present
                             else getattr(cfg, flag))
        config = StragglerConfig(**values, min_samples=mine.min_samples)
        if config != view.classifier.config:
            log.info("[master] the job's Monitor settings: %s", config)
        view.configure_straggler(config)
    return apply


def _lease_config() -> LeaseConfig:
    try:
        return LeaseConfig(min_seconds=FLAGS.lease_min_seconds,
                           initial_seconds=FLAGS.lease_initial_seconds,
                           max_seconds=FLAGS.lease_max_seconds, factor=FLAGS.lease_factor,
                           max_failures=FLAGS.max_shard_failures,
                           settle_seconds=FLAGS.settle_seconds)
    except ValueError as e:
        raise app.UsageError(f"bad lease flags: {e}") from e


def _backend_factories() -> dict:
    """The cluster backends this master can create for a submitted job beyond the built-in
    ones (``{"kubernetes": factory}`` when configured)."""
    if not FLAGS.kubernetes_image:
        return {}
    from antdt_tf.backends.k8s_settings import KubernetesSettings, in_cluster_namespace
    from antdt_tf.backends.kubernetes import KubernetesBackend

    selector = []
    for item in FLAGS.kubernetes_node_selector:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise app.UsageError(f"--kubernetes_node_selector: expected LABEL=VALUE, got "
                                 f"{item!r}")
        selector.append((key, value))
    namespace = FLAGS.kubernetes_namespace or in_cluster_namespace()
    if not namespace:
        raise app.UsageError("--kubernetes_namespace is needed outside a cluster's pod")
    try:
        settings = KubernetesSettings(
            namespace=namespace, job=FLAGS.kubernetes_job, image=FLAGS.kubernetes_image,
            service_account=FLAGS.kubernetes_service_account,
            volume_claim=FLAGS.kubernetes_volume_claim, mount_path=FLAGS.kubernetes_mount_path,
            token_secret=FLAGS.kubernetes_token_secret, tls_secret=FLAGS.kubernetes_tls_secret,
            tf_port=FLAGS.kubernetes_tf_port, distinct_ports=FLAGS.kubernetes_distinct_ports,
            node_selector=tuple(selector))
    except ValueError as e:
        raise app.UsageError(f"bad --kubernetes_* flags: {e}") from e
    kubeconfig = FLAGS.kubernetes_kubeconfig
    return {"kubernetes": lambda: KubernetesBackend(settings, kubeconfig=kubeconfig)}


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def _kept_tf_rpc_port() -> int:
    """The TF-RPC port this master served on before a restart (its state dir keeps it):
    the workers' graphs hold that address, so a restarted master serves there again."""
    if not FLAGS.state_dir:
        return 0
    try:
        return int(pathlib.Path(FLAGS.state_dir, "tf_rpc.port").read_text().strip())
    except (OSError, ValueError):
        return 0


async def _serve(servicer: ShardingServicer, token: str, tls, view, jobs) -> None:
    from antdt_tf.monitor.service import ClusterMonitorServicer

    server = MasterServer(servicer, bind=FLAGS.bind, port=FLAGS.port,
                          tick_seconds=FLAGS.tick_seconds, token=token,
                          monitor=ClusterMonitorServicer(view), job_control=jobs, tls=tls,
                          tf_rpc_port=FLAGS.tf_rpc_port or _kept_tf_rpc_port(),
                          advertise=FLAGS.advertise, unix_socket=FLAGS.unix_socket)
    try:
        await server.start()
    except (OSError, RuntimeError) as e:     # lost a race for the port since the check
        raise exitcodes.CannotServe(f"cannot serve on {FLAGS.bind}:{FLAGS.port}: {e}") from e
    if tls is not None and FLAGS.state_dir:
        _write_port_file(os.path.join(FLAGS.state_dir, "tf_rpc.port"), server.tf_rpc_port)
    log.info("[master] serving antdt.v1.ShardingService on %s (pid %d)", server.address, os.getpid())
    jobs.master_address = f"{_advertised_host()}:{server.port}"
    jobs.start()      # a job that was running when this master stopped carries on
    if FLAGS.port_file:
        _write_port_file(FLAGS.port_file, server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("[master] shutting down: draining for up to %.1fs", FLAGS.grace_seconds)
    await server.stop(FLAGS.grace_seconds)
    log.info("[master] stopped; state flushed")


def _advertised_host() -> str:
    """Where the job's tasks reach this master: --advertise, else the bound address
    (loopback for a wildcard bind)."""
    host = FLAGS.advertise or FLAGS.bind
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not 0 <= FLAGS.port <= 65535:
        raise app.UsageError(f"--port must be in [0, 65535], got {FLAGS.port}")
    if FLAGS.snapshot_every < 1:
        raise app.UsageError("--snapshot_every must be >= 1")
    if FLAGS.tick_seconds <= 0 or FLAGS.grace_seconds < 0:
        raise app.UsageError("--tick_seconds must be > 0 and --grace_seconds >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token, tls = auth.server_security(FLAGS.bind, "antdt-master")
    state = ShardState(_lease_config())
    _straggler_config()   # bad flags fail here, before anything is opened
    backends = _backend_factories()
    # the address and the state dir are checked before anything is created or opened
    for flag in ("port_file", "unix_socket"):
        path = getattr(FLAGS, flag)
        if path and (problem := exitcodes.output_file_problem(path, f"--{flag}")):
            return exitcodes.error(PROGRAM, problem)
    try:
        exitcodes.check_bindable(FLAGS.bind, FLAGS.port)
    except ValueError as e:
        return exitcodes.error(PROGRAM, e)
    except exitcodes.CannotServe as e:
        return exitcodes.error(PROGRAM, e, exitcodes.CANNOT_SERVE)
    store = None
    if FLAGS.state_dir:
        problem = _state_dir_problem(FLAGS.state_dir)
        if problem:
            return exitcodes.error(PROGRAM, problem)
        store = StateStore(FLAGS.state_dir, fsync=FLAGS.fsync, snapshot_every=FLAGS.snapshot_every)
        try:
            recovered = open_state(store, state, discard_corrupt=FLAGS.discard_corrupt_state)
        except (CorruptState, IncompatibleState, StateDirLocked, OSError) as e:
            print(f"antdt-master: error: {e}\n  (the state was left untouched; fix or move it, "
                  "or pass --discard_corrupt_state to set it aside and start fresh)",
                  file=sys.stderr)
            return exitcodes.BAD_STATE
        log.info("[master] state_dir %s: snapshot=%s, %d journal event(s) replayed, datasets %s",
                 FLAGS.state_dir, recovered["snapshot"], recovered["replayed"], state.datasets)
    else:
        log.warning("[master] no --state_dir: shard state is in memory only")
    from antdt_tf.monitor.view import ClusterView

    try:
        view = ClusterView(straggler=_straggler_config(), cluster_file=(
            os.path.join(FLAGS.state_dir, "job_cluster.pb") if FLAGS.state_dir else ""))
    except CorruptState as e:
        print(f"antdt-master: error: {e}\n  (move or delete the file to start without "
              "the job's cluster; the launcher publishes it again)", file=sys.stderr)
        return exitcodes.BAD_STATE
    from antdt_tf.master.job_control import JobControl

    try:
        jobs = JobControl(FLAGS.state_dir, policy_modules=tuple(FLAGS.policy_modules),
                          backends=backends, on_job=_job_monitor_settings(view))
    except CorruptState as e:
        print(f"antdt-master: error: {e}", file=sys.stderr)
        return exitcodes.BAD_STATE
    try:
        _run_event_loop(_serve(ShardingServicer(state, store), token, tls, view, jobs))
    except exitcodes.CannotServe as e:
        return exitcodes.error(PROGRAM, e, exitcodes.CANNOT_SERVE)
    return exitcodes.OK


def _state_dir_problem(path: str) -> str:
    """Why ``--state_dir`` cannot be used (created if missing), or ""."""
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"--state_dir={path} exists and is not a directory"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"--state_dir={path} cannot be created: {e.strerror}"
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        return f"--state_dir={path} is not readable and writable by this user"
    return ""


def _run_event_loop(main_coroutine) -> None:
    """uvloop when installed (≈15 % more calls per CPU second measured here), else asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_coroutine)
        return
    uvloop.run(main_coroutine)


def run():
    exitcodes.run(main, PROGRAM)


if __name__ == "__main__":
    run()
