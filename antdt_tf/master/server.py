"""The master's gRPC server: the sharding service, the cluster monitor, the workers'
TF-RPC data path and the health service, composed in one place."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
from typing import Callable, Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from antdt_tf.auth import TlsFiles, add_port, server_interceptors
from antdt_tf.monitor.service import ClusterMonitorServicer
from antdt_tf.monitor.view import ClusterView
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.rpc import SERVER_OPTIONS, LoopStub
from antdt_tf.sharding.service import SERVICE_NAME, ShardingServicer, generic_handler
from antdt_tf.sharding.tf_rpc import TfRpcServicer


@dataclasses.dataclass(frozen=True)
class MasterServices:
    """The master's services as its job runner calls them: in this process, on the
    server's event loop (``rpc.LoopStub``s with the stubs' faces)."""
    sharding: LoopStub
    monitor: LoopStub


class MasterServer:
    """The master's gRPC server: sharding service, cluster monitor, health service."""

    def __init__(self, servicer: ShardingServicer, bind: str = "127.0.0.1", port: int = 0,
                 tick_seconds: float = 0.5, monitor=None, token: str = "",
                 job_control=None, tls: Optional[TlsFiles] = None, tf_rpc_port: int = 0,
                 advertise: str = "", unix_socket: str = ""):
        """``tls``: the main port requires mutual TLS; TensorFlow's RPC ops (no TLS) then
        get a plaintext port of their own (``tf_rpc_port``, 0: any free one), reported
        by GetMasterInfo at ``advertise`` (default: the bind address). ``unix_socket``:
        also serve there (same security), for a client outside the job's network
        namespace (the local launcher)."""
        self.servicer = servicer
        self.monitor = monitor if monitor is not None else ClusterMonitorServicer(ClusterView())
        self.tf_rpc = TfRpcServicer(servicer, on_step=self.monitor.view.observe_step,
                                    token=token)
        self.bind = bind
        self.requested_port = port
        self.tick_seconds = tick_seconds
        self.token = token      # the job's token: every call but health checks needs it
        self.job_control = job_control      # antdt.v1.JobService (None: not served)
        self.tls = tls
        self.unix_socket = unix_socket
        self.requested_tf_rpc_port = tf_rpc_port
        self.advertise = advertise
        self.port: Optional[int] = None
        self.tf_rpc_port: Optional[int] = None
        self._server: Optional[grpc.aio.Server] = None
        self._tf_rpc_server: Optional[grpc.aio.Server] = None
        self._health = health.aio.HealthServicer()
        self._ticker: Optional[asyncio.Task] = None

    @property
    def address(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    async def start(self) -> int:
        self._server = grpc.aio.server(options=SERVER_OPTIONS,
                                       interceptors=server_interceptors(self.token, aio=True))
        self._server.add_generic_rpc_handlers((generic_handler(self.servicer),
                                               self.monitor.generic_handler(),
                                               self.tf_rpc.generic_handler()))
        if self.job_control is not None:
            self._server.add_generic_rpc_handlers((self.job_control.generic_handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        self.port = add_port(self._server, f"{host}:{self.requested_port}", self.tls)
        if not self.port:
            raise OSError(f"cannot bind {host}:{self.requested_port}")
        if self.unix_socket:
            pathlib.Path(self.unix_socket).unlink(missing_ok=True)   # a dead master's
            if not add_port(self._server, f"unix:{self.unix_socket}", self.tls):
                raise OSError(f"cannot serve on the Unix socket {self.unix_socket}")
        self.tf_rpc_port = self.port
        if self.tls is not None:
            # TF's RPC ops speak no TLS: their service alone, in plaintext, on a port of
            # the job's private network (its calls carry the token as an argument)
            self._tf_rpc_server = grpc.aio.server(options=SERVER_OPTIONS)
            self._tf_rpc_server.add_generic_rpc_handlers((self.tf_rpc.generic_handler(),))
            self.tf_rpc_port = self._tf_rpc_server.add_insecure_port(
                f"{host}:{self.requested_tf_rpc_port}")
            if not self.tf_rpc_port:
                raise OSError(f"cannot bind {host}:{self.requested_tf_rpc_port} (TF-RPC)")
            await self._tf_rpc_server.start()
        advertised = self.advertise or self.bind
        if advertised in ("0.0.0.0", "::"):
            advertised = "127.0.0.1"
        advertised = f"[{advertised}]" if ":" in advertised else advertised
        self.monitor.master_info = cpb.MasterInfo(
            tf_rpc_address=f"{advertised}:{self.tf_rpc_port}", tls=self.tls is not None)
        await self._server.start()
        for name in ("", SERVICE_NAME, self.monitor.SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        loop = asyncio.get_running_loop()
        if self.job_control is not None:
            # the job's runner is a thread of this process: it calls these services on
            # this loop, as their gRPC handlers do (no channel to itself)
            self.job_control.services = MasterServices(
                sharding=LoopStub(self.servicer, loop, self.servicer.after_call),
                monitor=LoopStub(self.monitor, loop))
        self._ticker = loop.create_task(self._tick_loop())
        return self.port

    async def _tick_loop(self):
        while True:
            await asyncio.sleep(self.tick_seconds)
            self.servicer.tick()
            self.monitor.view.tick()

    async def stop(self, grace: float = 5.0) -> None:
        """Goes NOT_SERVING, drains in-flight calls for ``grace`` seconds, flushes state."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        if self._tf_rpc_server is not None:
            await self._tf_rpc_server.stop(grace)
            self._tf_rpc_server = None
        await self._server.stop(grace)
        if self._ticker is not None:
            self._ticker.cancel()
        store = self.servicer.store
        if store is not None:
            store.close(final_state=self.servicer.state.snapshot())
        self._server = None


class BackgroundMaster:
    """Runs a :class:`MasterServer` on its own event-loop thread inside this process.

    For embedding a master in a launcher, a demo or a test; a production master is the
    ``antdt-master`` process. ``with BackgroundMaster(servicer) as m: m.address``.
    """

    def __init__(self, servicer: ShardingServicer, bind: str = "127.0.0.1", port: int = 0,
                 tick_seconds: float = 0.5, monitor=None, token: str = "",
                 job_control=None, tls: Optional[TlsFiles] = None):
        import threading

        self._loop = asyncio.new_event_loop()
        self.server = MasterServer(servicer, bind=bind, port=port, tick_seconds=tick_seconds,
                                   monitor=monitor, token=token, job_control=job_control,
                                   tls=tls)
        self._thread = threading.Thread(target=self._loop.run_forever, name="antdt-master",
                                        daemon=True)

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> "BackgroundMaster":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=30)
        return self

    def call(self, fn: Callable, *args):
        """Runs ``fn(*args)`` on the server's loop (where the state lives) and returns it."""
        async def _run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(_run(), self._loop).result(timeout=30)

    def stop(self, grace: float = 0.0) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
