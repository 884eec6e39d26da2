"""Who may call an antdt service: a per-job token, and no unauthenticated listening
beyond loopback.

Every antdt gRPC server (master, agent) checks the job's token on every call when it
has one; a call without it, or with another, is refused UNAUTHENTICATED before any
handler runs, so it changes nothing. The standard health service stays open (it only
says SERVING or not; probes of orchestrators call it without credentials).

The token comes from the environment (``ANTDT_JOB_TOKEN``) or a file (``--token_file``),
never from argv, which every local user can read in ``ps``. Clients attach the token
from the environment, so every process the job starts authenticates without a flag.

A server that binds anything but loopback without a token refuses to start unless the
user passes the loudly named opt-out ``--allow_unauthenticated_network_access``.

TensorFlow's RPC ops (the workers' data path to the master's ``tensorflow.rpc.RpcService``)
send no metadata: they pass the token as the last argument of every call, which the
master checks and strips (``antdt_tf.sharding.tf_rpc``).

Not covered yet (the security issue): TLS — the token travels in clear text, on the
network and, inside the workers' dataset functions, over TensorFlow's own channels.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import pathlib
from typing import Optional

import grpc

from antdt_tf.errors import AntdtError

TOKEN_ENV = "ANTDT_JOB_TOKEN"
TOKEN_METADATA_KEY = "antdt-token"
# Health checks are open; TF's RPC ops cannot send metadata, so the master's
# tensorflow.rpc.RpcService checks the token in each call's arguments instead
# (antdt_tf.sharding.tf_rpc).
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/tensorflow.rpc.RpcService/")
OPT_OUT_FLAG = "allow_unauthenticated_network_access"


class InsecureBind(AntdtError):
    """A server was asked to listen beyond loopback without authenticating callers."""


def job_token(token_file: str = "") -> str:
    """The job's token: the first line of ``token_file`` if given, else ``$ANTDT_JOB_TOKEN``,
    else "" (no authentication)."""
    if token_file:
        try:
            token = pathlib.Path(token_file).read_text().strip()
        except OSError as e:
            raise InsecureBind(f"cannot read the token file {token_file}: {e}") from e
        if not token:
            raise InsecureBind(f"the token file {token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip()


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False        # a name: may resolve anywhere


def check_exposure(bind: str, token: str, allow_unauthenticated: bool, program: str) -> None:
    """Refuses (InsecureBind) to serve beyond loopback without a token, unless the user
    opted out explicitly."""
    if is_loopback(bind) or token or allow_unauthenticated:
        return
    raise InsecureBind(
        f"{program} would listen on {bind} without authentication: anyone who reaches it "
        f"could control the job. Set {TOKEN_ENV} (or --token_file) on every process of the "
        f"job, or bind 127.0.0.1, or pass --{OPT_OUT_FLAG} on a network you trust.")


def define_server_flags(what: str) -> None:
    """``--token_file`` and ``--allow_unauthenticated_network_access`` for a server
    binary (call once at its import); ``what``: what an intruder could do."""
    from absl import flags

    flags.DEFINE_string("token_file", "", "File holding the job's token (default: "
                        f"${TOKEN_ENV}). With a token every call must carry it.")
    flags.DEFINE_boolean(OPT_OUT_FLAG, False, "Serve beyond loopback without a token: "
                         f"anyone who reaches the port {what}.")


def server_token(bind: str, program: str) -> str:
    """The token a server binary enforces (from its flags); refuses (absl UsageError) to
    serve beyond loopback without one unless the user opted out."""
    from absl import app, flags

    values = flags.FLAGS
    try:
        token = job_token(values.token_file)
        check_exposure(bind, token, getattr(values, OPT_OUT_FLAG), program)
    except InsecureBind as e:
        raise app.UsageError(str(e)) from e
    return token


def _refusal(method: str) -> str:
    return (f"{method}: missing or wrong job token ({TOKEN_METADATA_KEY} metadata; clients "
            f"read it from ${TOKEN_ENV})")


def _allowed(method: str, metadata, token: str) -> bool:
    if method.startswith(OPEN_METHOD_PREFIXES):
        return True
    got = dict(metadata or ()).get(TOKEN_METADATA_KEY, "")
    return hmac.compare_digest(got.encode(), token.encode())


class TokenInterceptor(grpc.ServerInterceptor):
    """Sync servers (the agent): refuses calls without the job's token."""

    def __init__(self, token: str):
        self.token = token

    def intercept_service(self, continuation, details):
        if _allowed(details.method, details.invocation_metadata, self.token):
            return continuation(details)
        message = _refusal(details.method)

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        return _refusing_handler(continuation(details), refuse)


class AioTokenInterceptor(grpc.aio.ServerInterceptor):
    """grpc.aio servers (the master): refuses calls without the job's token."""

    def __init__(self, token: str):
        self.token = token

    async def intercept_service(self, continuation, details):
        if _allowed(details.method, details.invocation_metadata, self.token):
            return await continuation(details)
        message = _refusal(details.method)

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        return _refusing_handler(await continuation(details), refuse)


def _refusing_handler(handler, refuse):
    """A handler of the same kind as ``handler`` whose body only refuses (the request is
    not deserialized: a refused caller's bytes are never parsed)."""
    ident = lambda b: b  # noqa: E731
    if handler is None or not (handler.request_streaming or handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(refuse, request_deserializer=ident)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, request_deserializer=ident)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, request_deserializer=ident)
    return grpc.unary_stream_rpc_method_handler(refuse, request_deserializer=ident)


def server_interceptors(token: str, aio: bool = False) -> tuple:
    if not token:
        return ()
    return (AioTokenInterceptor(token),) if aio else (TokenInterceptor(token),)


class _ClientToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor,
                   grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor):
    def __init__(self, token: str):
        self.token = token

    def _details(self, d):
        metadata = list(d.metadata or ()) + [(TOKEN_METADATA_KEY, self.token)]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials,
                            getattr(d, "wait_for_ready", None),
                            getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready = credentials, wait_for_ready
        self.compression = compression


def channel(address: str, options=None, token: Optional[str] = None) -> grpc.Channel:
    """An insecure channel to an antdt service that carries the job's token (``token``,
    or ``$ANTDT_JOB_TOKEN``; none: a plain channel)."""
    ch = grpc.insecure_channel(address, options=options)
    token = job_token() if token is None else token
    return grpc.intercept_channel(ch, _ClientToken(token)) if token else ch
