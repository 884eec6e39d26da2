"""Real processes for the multi-process tests: an ``antdt-master`` we start, watch and
kill by PID/process group (never by name)."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antdt_tf.procutil import child_env

MASTER_BIN = str(pathlib.Path(sys.executable).parent / "antdt-master")


def reachable(address: str, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds from this process."""
    import socket

    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class MasterProcess:
    def __init__(self, workdir: pathlib.Path, state_dir=None, port=0, flags=()):
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = state_dir
        self.port = port
        self.flags = list(flags)
        self.proc = None
        self.starts = 0

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self):
        return self.workdir / f"master.{self.starts}.log"

    def command(self):
        cmd = [MASTER_BIN, f"--port={self.port}", f"--port_file={self.workdir / 'port'}",
               "--tick_seconds=0.1", "--grace_seconds=2", *self.flags]
        if self.state_dir is not None:
            cmd.append(f"--state_dir={self.state_dir}")
        return cmd

    def spawn(self):
        """Starts the process without waiting for it to serve."""
        self.starts += 1
        port_file = self.workdir / "port"
        if port_file.exists():
            port_file.unlink()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=child_env())
        log.close()
        return self.proc

    def start(self, timeout=60.0):
        self.spawn()
        port_file = self.workdir / "port"
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"master exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"master did not serve within {timeout}s:\n{self.output()}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def output(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def health(self, service="antdt.v1.ShardingService"):
        with grpc.insecure_channel(self.address) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def kill(self, sig=signal.SIGKILL):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        return self.proc.wait(timeout=60)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)


def run_master_once(args, timeout=60):
    """Runs ``antdt-master`` with ``args`` expecting it to exit on its own."""
    return subprocess.run([MASTER_BIN, *args], capture_output=True, text=True, timeout=timeout)
