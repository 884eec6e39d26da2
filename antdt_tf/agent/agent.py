"""antdt-agent: the per-host daemon that owns a job's TensorFlow task processes.

Usage::

    antdt-agent --host_name=host0 --port=0 --port_file=/tmp/agent0.port \\
        --master=127.0.0.1:7470 --task_log_dir=/tmp/job/host0

On a real host (one agent per host; the master places tasks on the agents that report
to it — the rendezvous)::

    ANTDT_JOB_TOKEN=... antdt-agent --host_name=$(hostname) --master=10.0.0.5:7470 \\
        --advertise=10.0.0.7 --bind=10.0.0.7 --port=7471 --task_ports=20000-20999

Serves ``antdt.v1.Agent`` (StartTask / StopTask / ThrottleTask / ListTasks) and the
gRPC health service, and reports the liveness of its tasks to the master's
``antdt.v1.ClusterMonitor`` every ``--report_seconds`` and at once when a task exits.
Every process change of a job goes through an agent: the master's job runner asks (to
start the job's tasks, and to carry out the Controller's actions), the agent acts. Binds 127.0.0.1 unless ``--bind`` says otherwise;
beyond loopback it needs the job's token (``$ANTDT_JOB_TOKEN`` or ``--token_file``), which
every call must then carry (``antdt_tf.auth``); its tasks inherit the token.

SIGTERM/SIGINT stop every task the agent started (SIGTERM, then SIGKILL) and exit.
If the agent itself dies, its tasks die with it (PR_SET_PDEATHSIG): no orphans.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import threading
import time

import grpc
from absl import app, flags
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from antdt_tf import auth, exitcodes
from antdt_tf.agent.programs import PathPolicy
from antdt_tf.agent.supervisor import TaskSupervisor
from antdt_tf.errors import AntdtError
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.errors import ERROR_METADATA_KEY
from antdt_tf.rpc import SERVER_OPTIONS, status_of

FLAGS = flags.FLAGS
flags.DEFINE_string("host_name", "localhost", "Name of the host this agent represents.")
flags.DEFINE_integer("port", 0, "Port to serve on; 0 picks a free port (see --port_file).")
flags.DEFINE_string("bind", "127.0.0.1", "Address to bind. Default loopback only.")
flags.DEFINE_string("port_file", "", "Write the bound port here once serving.")
flags.DEFINE_string("master", "", "host:port of antdt-master to report liveness to "
                    "(empty: no reports).")
flags.DEFINE_string("task_log_dir", "", "Where task logs go (default: a temp dir).")
flags.DEFINE_float("report_seconds", 1.0, "Liveness report interval.")
flags.DEFINE_string("advertise", "", "The address of this host that other hosts reach "
                    "its tasks at (task endpoints); default: the --bind address.")
flags.DEFINE_string("task_ports", "20000-29999", "FIRST-LAST: ports this host's tasks may "
                    "serve on (the master picks one per task).")
flags.DEFINE_list("job_root", [], "Every path a task is started with (checkpoints, "
                  "reports, state) must lie under this directory (or one of these, "
                  "comma-separated); other paths are refused. Default: --task_log_dir.")
flags.DEFINE_list("read_roots", [], "Directories a task may also read (not write) data "
                  "from, e.g. the training data's directory.")
flags.DEFINE_list("program_roots", [], "Directories the jobs' own training programs may be "
                  "run from (a program file, or a module's code_dir, must lie under one, "
                  "symlinks resolved; docs/program.md). Empty: this agent runs antdt-tf's "
                  "own trainers only. Whoever holds the job's token may run any program "
                  "placed here, as with any job submission: allow only directories the "
                  "job's users write (docs/security.md).")
auth.define_server_flags("runs programs on this host")
flags.DEFINE_string("estimator_python", "", "Interpreter for tf.estimator programs (a TF 2.15 "
                    "venv, e.g. .venv-tf215/bin/python); default: this agent's Python.")

log = logging.getLogger("antdt.agent")
SERVICE_NAME = "antdt.v1.Agent"
PROGRAM = "antdt-agent"


class AgentServicer:
    """antdt.v1.Agent over a TaskSupervisor (sync gRPC: calls may block, e.g. StopTask)."""

    def __init__(self, supervisor: TaskSupervisor, host: str = "", advertise: str = "",
                 task_ports: tuple[int, int] = (0, 0)):
        self.supervisor = supervisor
        self.host, self.advertise, self.task_ports = host, advertise, task_ports

    def StartTask(self, req):
        return self.supervisor.start(req)

    def StopTask(self, req):
        return self.supervisor.stop(req)

    def ThrottleTask(self, req):
        return self.supervisor.throttle(req)

    def ListTasks(self, req):
        return cpb.ListTasksResponse(host=self.host, tasks=self.supervisor.list(),
                                     advertise=self.advertise,
                                     first_task_port=self.task_ports[0],
                                     last_task_port=self.task_ports[1],
                                     load_per_cpu=host_load())

    def generic_handler(self) -> grpc.GenericRpcHandler:
        from google.protobuf import message_factory
        from google.protobuf.message import DecodeError

        def wrap(fn, request_cls):
            def handle(raw: bytes, context: grpc.ServicerContext):
                request = request_cls()
                try:
                    request.ParseFromString(raw)
                except DecodeError as e:
                    context.set_trailing_metadata(((ERROR_METADATA_KEY, "InvalidRequest"),))
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}")
                try:
                    return fn(request)
                except AntdtError as e:
                    context.set_trailing_metadata(((ERROR_METADATA_KEY, type(e).__name__),))
                    context.abort(status_of(e), str(e))
            return handle

        service = cpb.DESCRIPTOR.services_by_name["Agent"]
        handlers = {
            m.name: grpc.unary_unary_rpc_method_handler(
                wrap(getattr(self, m.name), message_factory.GetMessageClass(m.input_type)),
                response_serializer=lambda msg: msg.SerializeToString())
            for m in service.methods}
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def host_load() -> float:
    """The host's 1-minute load average per CPU."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


class _Reporter:
    """Sends the agent's task list to the master periodically and on every exit."""

    def __init__(self, master: str, servicer: AgentServicer, address: str, supervisor_ref,
                 interval: float):
        from antdt_tf.monitor.client import MonitorClient

        self.client = MonitorClient(master)
        self.servicer, self.address = servicer, address
        self.supervisor_ref = supervisor_ref
        self.interval = interval
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agent-report", daemon=True)

    def _run(self):
        while not self.stopped.is_set():
            self.wake.wait(self.interval)
            self.wake.clear()
            try:
                s = self.servicer
                self.client.report_agent(s.host, self.address, self.supervisor_ref().list(),
                                         advertise=s.advertise, task_ports=s.task_ports,
                                         load_per_cpu=host_load())
            except AntdtError as e:   # master down or restarting: report again next time
                log.debug("liveness report not delivered: %s", e)


def parse_port_range(text: str) -> tuple[int, int]:
    """``FIRST-LAST`` -> (first, last), or a UsageError saying what is wrong."""
    try:
        first, last = (int(p) for p in text.split("-"))
    except ValueError:
        raise app.UsageError(f"--task_ports={text!r}: expected FIRST-LAST, e.g. 20000-29999")
    if not 1024 <= first <= last <= 65535:
        raise app.UsageError(f"--task_ports={text!r}: need 1024 <= FIRST <= LAST <= 65535")
    return first, last


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not 0 <= FLAGS.port <= 65535:
        raise app.UsageError(f"--port must be in [0, 65535], got {FLAGS.port}")
    if FLAGS.report_seconds <= 0:
        raise app.UsageError("--report_seconds must be > 0")
    task_ports = parse_port_range(FLAGS.task_ports)
    token, tls = auth.server_security(FLAGS.bind, "antdt-agent")
    if FLAGS.estimator_python and not os.access(FLAGS.estimator_python, os.X_OK):
        raise app.UsageError(f"--estimator_python={FLAGS.estimator_python} is not an executable")
    if FLAGS.port_file and (problem := exitcodes.output_file_problem(FLAGS.port_file,
                                                                      "--port_file")):
        return exitcodes.error(PROGRAM, problem)
    try:   # before anything is created (the task log dir) or started
        exitcodes.check_bindable(FLAGS.bind, FLAGS.port)
    except ValueError as e:
        return exitcodes.error(PROGRAM, e)
    except exitcodes.CannotServe as e:
        return exitcodes.error(PROGRAM, e, exitcodes.CANNOT_SERVE)
    if token:   # our clients (the report to the master) and our tasks carry it
        os.environ[auth.TOKEN_ENV] = token
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s agent[{FLAGS.host_name}]: %(message)s")
    import tempfile
    log_dir = FLAGS.task_log_dir or tempfile.mkdtemp(prefix=f"antdt-agent-{FLAGS.host_name}-")
    reporter = None
    paths = PathPolicy(tuple(os.path.abspath(r) for r in FLAGS.job_root or [log_dir]),
                       tuple(os.path.abspath(r) for r in FLAGS.read_roots),
                       tuple(os.path.abspath(r) for r in FLAGS.program_roots))
    try:
        supervisor = TaskSupervisor(log_dir, on_change=lambda s: reporter and reporter.wake.set(),
                                    estimator_python=FLAGS.estimator_python, paths=paths)
    except OSError as e:
        why = ("exists and is not a directory" if os.path.lexists(log_dir)
               and not os.path.isdir(log_dir) else f"cannot be created: {e.strerror or e}")
        return exitcodes.error(PROGRAM, f"--task_log_dir={log_dir} {why}")
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(8), options=SERVER_OPTIONS,
                         interceptors=auth.server_interceptors(token))
    servicer = AgentServicer(supervisor, FLAGS.host_name, FLAGS.advertise or FLAGS.bind,
                             task_ports)
    server.add_generic_rpc_handlers((servicer.generic_handler(),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host = f"[{FLAGS.bind}]" if ":" in FLAGS.bind else FLAGS.bind
    try:
        port = auth.add_port(server, f"{host}:{FLAGS.port}", tls)
    except RuntimeError:      # lost a race for the port since the check
        port = 0
    if not port:
        supervisor.close()
        return exitcodes.error(PROGRAM, f"cannot bind {host}:{FLAGS.port}",
                               exitcodes.CANNOT_SERVE)
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    address = f"{host}:{port}"
    if FLAGS.master:
        reporter = _Reporter(FLAGS.master, servicer, address, lambda: supervisor,
                             FLAGS.report_seconds)
        reporter.thread.start()
    # Signals only set a flag that the main thread polls: Event.set() in a handler can
    # deadlock when the signal lands while the main thread holds that event's lock.
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    if FLAGS.port_file:
        tmp = f"{FLAGS.port_file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, FLAGS.port_file)
    log.info("serving antdt.v1.Agent on %s (pid %d), task logs in %s, job root %s",
             address, os.getpid(), log_dir, ",".join(paths.job_roots))
    while not stopping:
        time.sleep(0.2)
    log.info("stopping: ending every task this agent started")
    health_servicer.enter_graceful_shutdown()
    supervisor.close()
    if reporter is not None:
        reporter.stopped.set()
        reporter.wake.set()
    server.stop(2).wait()
    return 0


def run():
    exitcodes.run(main, PROGRAM)


if __name__ == "__main__":
    run()
