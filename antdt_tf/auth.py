"""Who may call an antdt service: mutual TLS with the job's CA, a per-job token, and no
unauthenticated or plaintext listening beyond loopback.

Every antdt gRPC server (master, agent) checks the job's token on every call when it
has one; a call without it, or with another, is refused UNAUTHENTICATED before any
handler runs, so it changes nothing. The standard health service stays open (it only
says SERVING or not; probes of orchestrators call it without credentials).

The token comes from the environment (``ANTDT_JOB_TOKEN``) or a file (``--token_file``),
never from argv, which every local user can read in ``ps``. Clients attach the token
from the environment, so every process the job starts authenticates without a flag.

TLS is mutual: a server with ``--tls_cert/--tls_key/--tls_ca`` (or ``$ANTDT_TLS_CERT``,
``$ANTDT_TLS_KEY``, ``$ANTDT_TLS_CA``) serves only clients whose certificate the job's CA
signed, and clients (which read the same variables) trust only servers the CA signed.
Servers export their settings to their environment, so every process an agent starts
uses them without a flag. ``$ANTDT_TLS_SERVER_NAME``: the name clients check in the
server's certificate instead of the address they dial (one job certificate for hosts
whose addresses are not known up front).

A server that binds anything but loopback refuses to start without a token (opt-out:
``--allow_unauthenticated_network_access``) and without TLS (opt-out:
``--allow_plaintext_network_access``: the token would travel in clear text).

TensorFlow's RPC ops (the workers' data path to the master's ``tensorflow.rpc.RpcService``)
send no metadata and speak no TLS: they pass the token as the last argument of every call,
which the master checks and strips (``antdt_tf.sharding.tf_rpc``); with TLS on, the master
serves them on a second, plaintext port that belongs to the job's private network, like
TensorFlow's own ports (docs/security.md).
"""

from __future__ import annotations

import dataclasses
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
PLAINTEXT_OPT_OUT_FLAG = "allow_plaintext_network_access"
TLS_ENV = {"cert": "ANTDT_TLS_CERT", "key": "ANTDT_TLS_KEY", "ca": "ANTDT_TLS_CA"}
TLS_SERVER_NAME_ENV = "ANTDT_TLS_SERVER_NAME"


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


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The PEM files of a process's TLS identity: its certificate and key, and the job's
    CA (which signed every certificate of the job)."""
    cert: str
    key: str
    ca: str

    @classmethod
    def from_env(cls, env=None) -> Optional["TlsFiles"]:
        env = os.environ if env is None else env
        values = {k: env.get(v, "") for k, v in TLS_ENV.items()}
        if not any(values.values()):
            return None
        return cls.of(**values)

    @classmethod
    def of(cls, cert: str, key: str, ca: str) -> "TlsFiles":
        """Checks that all three are given and readable (InsecureBind saying which not)."""
        missing = [n for n, v in (("cert", cert), ("key", key), ("ca", ca)) if not v]
        if missing:
            raise InsecureBind("TLS needs a certificate, its key and the job's CA: missing "
                               + ", ".join(f"--tls_{n} (${TLS_ENV[n]})" for n in missing))
        tls = cls(*(os.path.abspath(v) for v in (cert, key, ca)))
        tls.read()
        return tls

    def read(self) -> tuple[bytes, bytes, bytes]:
        out = []
        for name, path in (("certificate", self.cert), ("key", self.key), ("CA", self.ca)):
            try:
                data = pathlib.Path(path).read_bytes()
            except OSError as e:
                raise InsecureBind(f"cannot read the TLS {name} {path}: {e.strerror}") from e
            if b"-----BEGIN" not in data:
                raise InsecureBind(f"the TLS {name} {path} is not a PEM file")
            out.append(data)
        return tuple(out)

    def export(self, env=None) -> None:
        """Puts the files in ``env`` (default: this process's), so clients made here and
        child processes use them."""
        env = os.environ if env is None else env
        for name, var in TLS_ENV.items():
            env[var] = getattr(self, name)


def check_exposure(bind: str, token: str, allow_unauthenticated: bool, program: str,
                   tls: Optional[TlsFiles] = None, allow_plaintext: bool = False) -> None:
    """Refuses (InsecureBind) to serve beyond loopback without a token or without TLS,
    unless the user opted out explicitly."""
    if is_loopback(bind):
        return
    if not token and not allow_unauthenticated:
        raise InsecureBind(
            f"{program} would listen on {bind} without authentication: anyone who reaches it "
            f"could control the job. Set {TOKEN_ENV} (or --token_file) on every process of "
            f"the job, or bind 127.0.0.1, or pass --{OPT_OUT_FLAG} on a network you trust.")
    if tls is None and not allow_plaintext and not allow_unauthenticated:
        raise InsecureBind(
            f"{program} would listen on {bind} without TLS: the job's token and every "
            "request would cross the network in clear text. Give --tls_cert, --tls_key and "
            f"--tls_ca (or ${TLS_ENV['cert']}, ${TLS_ENV['key']}, ${TLS_ENV['ca']}), or "
            f"bind 127.0.0.1, or pass --{PLAINTEXT_OPT_OUT_FLAG} on a network you trust.")


def define_server_flags(what: str) -> None:
    """``--token_file`` and ``--allow_unauthenticated_network_access`` for a server
    binary (call once at its import); ``what``: what an intruder could do."""
    from absl import flags

    flags.DEFINE_string("token_file", "", "File holding the job's token (default: "
                        f"${TOKEN_ENV}). With a token every call must carry it.")
    flags.DEFINE_boolean(OPT_OUT_FLAG, False, "Serve beyond loopback without a token: "
                         f"anyone who reaches the port {what}.")
    flags.DEFINE_boolean(PLAINTEXT_OPT_OUT_FLAG, False, "Serve beyond loopback without "
                         "TLS: the token and every request cross the network in clear text.")
    define_tls_flags()


def define_tls_flags() -> None:
    """``--tls_cert``, ``--tls_key``, ``--tls_ca`` (default: the ``$ANTDT_TLS_*``
    variables); for servers and clients alike."""
    from absl import flags

    for name, what in (("cert", "this process's certificate"), ("key", "its private key"),
                       ("ca", "the job's CA certificate (it signed every certificate of "
                              "the job; peers without one are refused)")):
        flags.DEFINE_string(f"tls_{name}", "", f"PEM file: {what}. Default: "
                            f"${TLS_ENV[name]}. All three or none; none: no TLS.")


def flag_tls() -> Optional[TlsFiles]:
    """The TLS files from ``--tls_*`` (else the environment), checked and exported to
    this process's environment; None without TLS. Raises absl UsageError."""
    from absl import app, flags

    values = flags.FLAGS
    try:
        given = [values.tls_cert, values.tls_key, values.tls_ca]
        tls = TlsFiles.of(*given) if any(given) else TlsFiles.from_env()
    except InsecureBind as e:
        raise app.UsageError(str(e)) from e
    if tls is not None:
        tls.export()
    return tls


def server_security(bind: str, program: str) -> tuple[str, Optional[TlsFiles]]:
    """The token a server binary enforces and its TLS files (from its flags or the
    environment); refuses (absl UsageError) to serve beyond loopback without a token or
    without TLS unless the user opted out."""
    from absl import app, flags

    values = flags.FLAGS
    tls = flag_tls()
    try:
        token = job_token(values.token_file)
        check_exposure(bind, token, getattr(values, OPT_OUT_FLAG), program, tls,
                       getattr(values, PLAINTEXT_OPT_OUT_FLAG))
    except InsecureBind as e:
        raise app.UsageError(str(e)) from e
    return token, tls


def add_port(server, address: str, tls: Optional[TlsFiles]) -> int:
    """Binds ``address`` on a grpc (or grpc.aio) server: mutual TLS with ``tls``, else
    plaintext. Returns the port (0: could not bind)."""
    if tls is None:
        return server.add_insecure_port(address)
    cert, key, ca = tls.read()
    return server.add_secure_port(address, grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True))


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


_FROM_ENV = object()


def channel(address: str, options=None, token: Optional[str] = None,
            tls=_FROM_ENV) -> grpc.Channel:
    """A channel to an antdt service: mutual TLS when the process has TLS files (``tls``,
    default ``$ANTDT_TLS_*``), carrying the job's token (``token``, default
    ``$ANTDT_JOB_TOKEN``; none: no token)."""
    tls = TlsFiles.from_env() if tls is _FROM_ENV else tls
    if tls is None:
        ch = grpc.insecure_channel(address, options=options)
    else:
        cert, key, ca = tls.read()
        options = list(options or ())
        # a Unix socket has no host name: the server's certificate must name localhost
        name = os.environ.get(TLS_SERVER_NAME_ENV, "") or (
            "localhost" if address.startswith("unix:") else "")
        if name:
            options.append(("grpc.ssl_target_name_override", name))
        ch = grpc.secure_channel(address, grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert), options=options)
    token = job_token() if token is None else token
    return grpc.intercept_channel(ch, _ClientToken(token)) if token else ch


def tls_enabled() -> bool:
    return TlsFiles.from_env() is not None


def make_job_ca(directory, hosts=("127.0.0.1", "localhost"), days: int = 7) -> TlsFiles:
    """A throw-away CA and one job certificate it signed (valid for ``hosts``: IP
    addresses or DNS names, and as server and client) in ``directory``, keys readable by
    this user only. For local runs and tests; production jobs bring their own PKI."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "antdt job CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "antdt job")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files = TlsFiles(str(directory / "job.crt"), str(directory / "job.key"),
                     str(directory / "ca.crt"))
    _write_private(directory / "job.key", key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    pathlib.Path(files.cert).write_bytes(cert.public_bytes(pem))
    pathlib.Path(files.ca).write_bytes(ca.public_bytes(pem))
    return files


def _write_private(path: pathlib.Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
