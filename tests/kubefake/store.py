"""The fake API server's state: objects by kind, one resource-version counter, and the
event history watches replay from (``compact`` forgets it, as etcd compaction does).

Semantics kept from the real API server: every write bumps the global resource version
and is an event (ADDED / MODIFIED / DELETED); a graceful delete of a pod only sets
``deletionTimestamp`` (the kubelet removes it once its containers ended); deleting an
object deletes what names it in ``ownerReferences`` (background propagation); objects
are validated against the Kubernetes OpenAPI schemas on create and patch.
"""

from __future__ import annotations

import copy
import datetime
import re
import threading
import uuid
from typing import Optional

NAMESPACED = ("pods", "services", "configmaps")
KINDS = {"pods": "Pod", "services": "Service", "configmaps": "ConfigMap", "nodes": "Node",
         "namespaces": "Namespace"}
SCHEMA_VERSION = "1.37.0"
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")


class ApiError(Exception):
    """An API ``Status`` failure: HTTP code, reason, message."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(target: dict, patch: dict) -> dict:
    """JSON merge patch (RFC 7386): what the fake does for merge and strategic patches."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


def matches_labels(labels: dict, selector: str) -> bool:
    """``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``."""
    if not selector:
        return True
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = term.strip()
        if not term:
            continue
        m = re.match(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\Z", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            has = labels.get(m.group(1)) in values
            if has != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        k, _, v = term.partition("=")
        value = obj
        for part in k.strip().split("."):
            value = (value or {}).get(part) if isinstance(value, dict) else None
        if str(value or "") != v.strip():
            return False
    return True


class Store:
    def __init__(self, validate: bool = True):
        self.lock = threading.Condition()
        self.objects: dict[str, dict[tuple, dict]] = {k: {} for k in KINDS}
        self.rv = 100
        self.history: list[tuple[int, str, str, dict]] = []   # (rv, kind, type, object)
        self.compacted = 0           # events at or below this rv are forgotten
        self.validate = validate
        self.listeners = []          # called (kind, type, obj) under the lock

    # -------------------------------------------------------------- events

    def _event(self, kind: str, type_: str, obj: dict) -> None:
        self.history.append((self.rv, kind, type_, copy.deepcopy(obj)))
        for listener in self.listeners:
            listener(kind, type_, obj)
        self.lock.notify_all()

    def _bump(self, obj: dict) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def compact(self) -> None:
        with self.lock:
            self.compacted = self.rv
            self.history.clear()

    # -------------------------------------------------------------- checks

    def _check(self, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if kind == "services":
            if not (len(name) <= 63 and _LABEL.match(name)):
                raise ApiError(422, "Invalid", f'Service "{name}" is invalid: metadata.name: '
                               "must be a DNS-1035 label")
        elif not (len(name) <= 253 and _SUBDOMAIN.match(name)):
            raise ApiError(422, "Invalid", f'{KINDS[kind]} "{name}" is invalid: metadata.name: '
                           "must be a DNS-1123 subdomain")
        if not self.validate:
            return
        import kubernetes_validate

        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise ApiError(422, "Invalid", f'{KINDS[kind]} "{name}" is invalid: {path}: '
                           f"{e.message}") from None
        if kind == "pods" and len(obj["spec"].get("containers") or []) != 1:
            raise ApiError(422, "Invalid", "the fake kubelet runs pods of one container")

    # -------------------------------------------------------------- verbs

    def create(self, kind: str, namespace: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", "v1")
        obj.setdefault("kind", KINDS[kind])
        meta = obj.setdefault("metadata", {})
        if kind in NAMESPACED:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match "
                               "the namespace of the request")
            meta["namespace"] = namespace
        for k in ("resourceVersion", "uid", "creationTimestamp", "deletionTimestamp"):
            meta.pop(k, None)
        self._check(kind, obj)
        with self.lock:
            key = (namespace, meta["name"])
            if key in self.objects[kind]:
                raise ApiError(409, "AlreadyExists",
                               f'{kind} "{meta["name"]}" already exists')
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            if kind == "pods":
                obj.setdefault("status", {"phase": "Pending"})
                obj["spec"].setdefault("terminationGracePeriodSeconds", 30)
            self._bump(obj)
            self.objects[kind][key] = obj
            self._event(kind, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, kind: str, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects[kind].get((namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            return copy.deepcopy(obj)

    def list(self, kind: str, namespace: Optional[str], labels: str = "",
             fields: str = "") -> tuple[list[dict], str]:
        with self.lock:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self.objects[kind].items())
                     if (namespace is None or ns == namespace)
                     and matches_labels(o["metadata"].get("labels") or {}, labels)
                     and matches_fields(o, fields)]
            return items, str(self.rv)

    def update(self, kind: str, namespace: str, name: str, change) -> dict:
        """Applies ``change(obj)`` (the fake's own writes: status, node conditions)."""
        with self.lock:
            obj = self.objects[kind].get((namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            change(obj)
            self._bump(obj)
            self._event(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def patch(self, kind: str, namespace: str, name: str, patch: dict) -> dict:
        with self.lock:
            obj = self.objects[kind].get((namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            new = merge(copy.deepcopy(obj), patch)
            for k in ("uid", "name", "namespace", "creationTimestamp"):
                new["metadata"][k] = obj["metadata"].get(k)
            self._check(kind, new)
            obj.clear()
            obj.update(new)
            self._bump(obj)
            self._event(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, kind: str, namespace: str, name: str,
               grace: Optional[int] = None) -> dict:
        """A pod with a grace period is only marked (the kubelet ends it); anything else
        goes at once, and its dependents after it."""
        with self.lock:
            obj = self.objects[kind].get((namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            if kind == "pods":
                if grace is None:
                    grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
                phase = obj.get("status", {}).get("phase")
                bound = obj["spec"].get("nodeName")
                if grace > 0 and bound and phase in ("Pending", "Running"):
                    meta = obj["metadata"]
                    old = meta.get("deletionGracePeriodSeconds")
                    if old is None or grace < old:
                        meta["deletionTimestamp"] = meta.get("deletionTimestamp") or now()
                        meta["deletionGracePeriodSeconds"] = grace
                        self._bump(obj)
                        self._event(kind, "MODIFIED", obj)
                    return copy.deepcopy(obj)
            return self.remove(kind, namespace, name)

    def remove(self, kind: str, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects[kind].pop((namespace, name), None)
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            self._bump(obj)
            self._event(kind, "DELETED", obj)
            uid = obj["metadata"]["uid"]
            for dep_kind in NAMESPACED:        # the garbage collector, in background
                for (ns, dep), o in list(self.objects[dep_kind].items()):
                    if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences")
                           or []):
                        try:
                            self.delete(dep_kind, ns, dep)
                        except ApiError:
                            pass
            return copy.deepcopy(obj)

    def events_after(self, kind: str, rv: int) -> list[tuple[int, str, dict]]:
        """Events of ``kind`` newer than ``rv``; ApiError(410) when ``rv`` was compacted."""
        if rv < self.compacted:
            raise ApiError(410, "Expired", f"too old resource version: {rv} "
                           f"({self.compacted})")
        return [(r, t, o) for r, k, t, o in self.history if k == kind and r > rv]
