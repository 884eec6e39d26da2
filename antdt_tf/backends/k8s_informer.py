"""A list-then-watch cache of one kind of Kubernetes object (client-go's informer, on
the official ``kubernetes`` client's raw responses): the Kubernetes backend's view of
its pods and the cluster's nodes, kept without asking the API server per call."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)


def resource_version(obj: dict) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0



class Informer:
    """A list-then-watch cache of one kind of object, like client-go's informer: resumes
    the watch from the last resource version after a dropped connection, relists after
    ``410 Gone`` and every ``resync_seconds``. ``on_delete`` keeps what a deleted object
    was (the backend's tombstones)."""

    def __init__(self, name: str, list_fn: Callable, kwargs: dict, resync_seconds: float,
                 on_delete: Optional[Callable[[dict], None]] = None,
                 watch_seconds: int = 60):
        self.name, self.list_fn, self.kwargs = name, list_fn, kwargs
        self.resync_seconds, self.on_delete = resync_seconds, on_delete
        self.watch_seconds = watch_seconds
        self.lock = threading.Lock()
        self.objects: dict[str, dict] = {}
        self.rv = ""
        self.synced_at = 0.0
        self.relists = 0                  # for tests and the log: how often it relisted
        self.resumes = 0                  # watches resumed from a resource version
        self._stop = threading.Event()
        self._watch = None
        self.relist()
        self._thread = threading.Thread(target=self._run, name=f"antdt-k8s-{name}",
                                        daemon=True)
        self._thread.start()

    def relist(self) -> None:
        resp = self.list_fn(**self.kwargs, _preload_content=False)
        body = json.loads(resp.data)
        with self.lock:
            new = {o["metadata"]["name"]: o for o in body.get("items") or []}
            for name, old in self.objects.items():
                if name not in new and self.on_delete is not None:
                    self.on_delete(old)
            self.objects = new
            self.rv = (body.get("metadata") or {}).get("resourceVersion", "")
            self.synced_at = time.monotonic()
            self.relists += 1

    def put(self, obj: dict) -> None:
        """An object this process just wrote (newer than the cache unless a newer event
        arrived first)."""
        with self.lock:
            name = obj["metadata"]["name"]
            old = self.objects.get(name)
            if old is None or resource_version(obj) >= resource_version(old):
                self.objects[name] = obj

    def get(self, name: str) -> Optional[dict]:
        with self.lock:
            return self.objects.get(name)

    def all(self) -> list[dict]:
        with self.lock:
            return list(self.objects.values())

    def _apply(self, kind: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                old = self.objects.pop(name, None)
                if self.on_delete is not None:
                    self.on_delete(obj if old is None or resource_version(obj) >= resource_version(old) else old)
            elif kind in ("ADDED", "MODIFIED"):
                old = self.objects.get(name)
                if old is None or resource_version(obj) >= resource_version(old):
                    self.objects[name] = obj
            rv = obj["metadata"].get("resourceVersion")
            if rv:
                self.rv = rv

    def _run(self) -> None:
        from kubernetes.client.rest import ApiException

        while not self._stop.is_set():
            try:
                if time.monotonic() - self.synced_at > self.resync_seconds:
                    self.relist()
                if self._watch_once():
                    self.relist()            # 410 Gone: what we saw is compacted away
                else:
                    self.resumes += 1
            except ApiException as e:
                if self._stop.is_set():
                    return
                if e.status == 410:
                    self._relist_quietly()
                else:
                    log.warning("[k8s] %s watch failed (%s); retrying", self.name, e.status)
                    self._stop.wait(1.0)
            except Exception as e:  # noqa: BLE001 (a dropped connection: resume)
                if self._stop.is_set():
                    return
                log.info("[k8s] %s watch dropped (%s); resuming from %s", self.name,
                         type(e).__name__, self.rv)
                self._stop.wait(0.2)

    def _watch_once(self) -> bool:
        """One watch request from ``self.rv`` until it ends; True when the server said
        the version is gone (410). The raw stream, not ``kubernetes.watch.Watch``: its
        retry and error handling assume deserialized events."""
        from kubernetes.watch.watch import iter_resp_lines

        resp = self.list_fn(**self.kwargs, watch=True, resource_version=self.rv,
                            timeout_seconds=self.watch_seconds, allow_watch_bookmarks=True,
                            _preload_content=False)
        self._watch = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return False
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return True
                    log.warning("[k8s] %s watch: %s", self.name, obj.get("message"))
                    return False
                if kind == "BOOKMARK":
                    with self.lock:
                        self.rv = obj["metadata"].get("resourceVersion") or self.rv
                    continue
                self._apply(kind, obj)
            return False
        finally:
            self._watch = None
            resp.close()
            resp.release_conn()

    def _relist_quietly(self) -> None:
        try:
            self.relist()
        except Exception as e:  # noqa: BLE001
            log.warning("[k8s] %s relist failed: %s", self.name, e)
            self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        resp = self._watch
        if resp is not None:
            try:
                resp.shutdown()       # ends the blocked read of the stream
            except Exception:  # noqa: BLE001 (already closed)
                pass
        self._thread.join(timeout=5)
