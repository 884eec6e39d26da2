"""The fake API server's HTTP face: the core/v1 REST paths the ``kubernetes`` client
calls, JSON in and out, ``Status`` objects for errors, a bearer token, and watches as
chunked streams of newline-delimited events (an expired resource version is one
``ERROR`` event with a ``410 Expired`` Status, as the real server sends it)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubefake.store import KINDS, ApiError, Store

_PATH = re.compile(r"/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<kind>[a-z]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?\Z")


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: Store, token: str):
        self.store, self.token = store, token
        self.watch_sockets: set = set()
        self.watch_lock = threading.Lock()
        self.closing = False
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def drop_watches(self) -> None:
        """Every open watch connection ends abruptly (a load balancer's idle cut, an API
        server restart): clients must resume from their last resource version."""
        with self.watch_lock:
            socks = list(self.watch_sockets)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.store.lock:
            self.store.lock.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):      # quiet
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return {}
        try:
            return json.loads(self.rfile.read(n))
        except ValueError:
            raise ApiError(400, "BadRequest", "the body is not JSON") from None

    def _route(self):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        m = _PATH.match(url.path)
        if m is None or m["kind"] not in KINDS:
            raise ApiError(404, "NotFound", f"the server could not find the requested "
                           f"resource ({url.path})")
        return m["ns"], m["kind"], m["name"], m["sub"], query

    def _handle(self, method: str) -> None:
        try:
            if self.headers.get("Authorization") != f"Bearer {self.server.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            ns, kind, name, sub, query = self._route()
            store = self.server.store
            if sub not in (None, "status"):
                raise ApiError(404, "NotFound", f"no subresource {sub}")
            if method == "GET" and name is None:
                if query.get("watch") in ("true", "1"):
                    return self._watch(kind, ns, query)
                items, rv = store.list(kind, ns, query.get("labelSelector", ""),
                                       query.get("fieldSelector", ""))
                return self._send(200, {"kind": f"{KINDS[kind]}List", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": rv}, "items": items})
            if method == "GET":
                return self._send(200, store.get(kind, ns or "", name))
            if method == "POST" and name is None:
                if kind == "nodes":
                    raise ApiError(405, "MethodNotAllowed", "nodes are the fake's own")
                return self._send(201, store.create(kind, ns, self._body()))
            if method == "PATCH" and name:
                return self._send(200, store.patch(kind, ns or "", name, self._body()))
            if method == "DELETE" and name:
                body = self._body()
                grace = query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
                return self._send(200, store.delete(kind, ns or "", name,
                                                    None if grace is None else int(grace)))
            raise ApiError(405, "MethodNotAllowed", f"{method} {self.path}")
        except ApiError as e:
            self._send(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PATCH(self):
        self._handle("PATCH")

    def do_DELETE(self):
        self._handle("DELETE")

    # -------------------------------------------------------------- watch

    def _chunk(self, event: dict) -> None:
        data = (json.dumps(event) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, kind: str, ns, query: dict) -> None:
        from kubefake.store import matches_fields, matches_labels

        store = self.server.store
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        timeout = float(query.get("timeoutSeconds") or 1800)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        with self.server.watch_lock:
            self.server.watch_sockets.add(self.connection)
        deadline = time.monotonic() + timeout

        def wanted(obj):
            meta = obj["metadata"]
            return ((ns is None or meta.get("namespace") == ns)
                    and matches_labels(meta.get("labels") or {}, labels)
                    and matches_fields(obj, fields))
        try:
            rv_text = query.get("resourceVersion", "")
            with store.lock:
                if rv_text in ("", "0"):
                    items, rv = store.list(kind, ns, labels, fields)
                    pending = [("ADDED", o) for o in items]
                    rv = int(rv)
                else:
                    rv = int(rv_text)
                    pending = []
            for type_, obj in pending:
                self._chunk({"type": type_, "object": obj})
            while time.monotonic() < deadline and not self.server.closing:
                with store.lock:
                    try:
                        events = store.events_after(kind, rv)
                    except ApiError as e:
                        events = None
                        error = e
                    if events == []:
                        store.lock.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                        continue
                if events is None:
                    self._chunk({"type": "ERROR", "object": error.status()})
                    break
                for r, type_, obj in events:
                    rv = r
                    if wanted(obj):
                        self._chunk({"type": type_, "object": obj})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (OSError, ValueError):
            pass          # the client went away, or drop_watches cut it
        finally:
            with self.server.watch_lock:
                self.server.watch_sockets.discard(self.connection)
