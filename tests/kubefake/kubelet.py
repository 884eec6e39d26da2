"""The fake cluster's scheduler, kubelets, node lifecycle controller and DNS, in one loop.

- **Scheduler**: binds a pending pod to a Ready node that its ``nodeSelector`` and
  required node affinity allow (fewest pods first); else condition ``PodScheduled=False``,
  reason ``Unschedulable``.
- **Kubelet**: runs a bound pod's one container as a local process (its own process
  group): ``command + args`` with ``$(VAR)`` expanded from the container's env, ``python``
  is this interpreter (the image is ignored), env = this process's + the container's +
  the downward API (``status.podIP``, ``metadata.name``, ``metadata.namespace``,
  ``spec.nodeName``, labels). Each pod gets its own address in 127.64.0.0/16. Reports
  ``Running`` / ``Succeeded`` / ``Failed`` with the container's ``terminated`` state as
  container runtimes do (exit code 128+N and ``signal`` for a signal); enforces
  ``resources.limits.memory`` like the cgroup OOM killer (SIGKILL, ``OOMKilled``, 137);
  ends a deleted pod with SIGTERM, SIGKILL after its grace period, then removes it.
- **Node lifecycle**: a lost node's processes die, its ``Ready`` condition goes
  ``Unknown``, its pods' ``Ready`` condition ``False``; after ``eviction_seconds`` they
  are marked for deletion (taint-based eviction) and stay ``Terminating`` until
  force-deleted, as no kubelet confirms.
- **Cluster DNS** (``pod_dns``): every pod process runs in a mount namespace of its own
  whose ``/etc/hosts`` is the cluster's hosts file: each headless Service's names
  (``svc``, ``svc.ns``, ``svc.ns.svc``, ``svc.ns.svc.cluster.local``) -> the address of
  its ready pod, rewritten in place on every change (needs root, :func:`pod_dns_available`).

- **Readiness**: a container's ``tcpSocket`` readiness probe is tried every 0.5 s (its
  pod's ``Ready`` condition; DNS names only ready pods unless the Service publishes
  not-ready addresses); without a probe a running container is ready.
- **A busy node** (:meth:`Kubelets.slow_node`): every container on it gets 1/factor of
  the time, as a noisy neighbour on a non-dedicated host would leave it.

Not done: other probe kinds, init containers, volumes (a pod sees this machine's files),
resource requests, restart policies other than Never, network isolation (pods share this
machine's network: two pods cannot serve the same port).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

from kubefake.store import ApiError, Store, matches_labels, now

_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "K": 10**3,
          "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(text) -> int:
    m = re.match(r"([0-9.]+)([A-Za-z]*)\Z", str(text))
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    return int(float(m.group(1)) * _UNITS.get(m.group(2), 1))


def expand(text: str, env: dict) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$(VAR)`` stays literal)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  text)


def _rss(pid: int) -> int:
    """Resident memory of the process group led by ``pid`` (bytes)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pid:          # pgrp
                continue
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


class _Container:
    def __init__(self, proc: subprocess.Popen, limit: int, log, probe_port: int = 0,
                 ip: str = ""):
        self.proc, self.limit, self.log = proc, limit, log
        self.started = now()
        self.oom = False
        self.term_sent: Optional[float] = None
        self.probe_port, self.ip = probe_port, ip    # a tcpSocket readiness probe
        self.node = ""
        self.ready = not probe_port
        self.probed_at = 0.0


def _probe_port(container: dict) -> int:
    """The port of the container's tcpSocket readiness probe (0: no probe)."""
    port = ((container.get("readinessProbe") or {}).get("tcpSocket") or {}).get("port", 0)
    if isinstance(port, str):
        port = next((p["containerPort"] for p in container.get("ports") or []
                     if p.get("name") == port), 0)
    return int(port or 0)


class Kubelets:
    def __init__(self, store: Store, nodes: list[str], workdir: str, eviction_seconds: float,
                 pod_dns: bool):
        self.store, self.workdir = store, workdir
        self.eviction_seconds, self.pod_dns = eviction_seconds, pod_dns
        self.containers: dict[tuple, _Container] = {}
        self.lost_at: dict[str, float] = {}
        self.next_ip = 1
        self.hosts_file = os.path.join(workdir, "hosts")
        with open("/etc/hosts") as f:
            self.base_hosts = f.read()
        with open(self.hosts_file, "w") as f:
            f.write(self.base_hosts)
        self.dns: dict[str, str] = {}
        self.slow: dict[str, float] = {}   # node -> slowdown factor (slow_node)
        self.lock = threading.RLock()      # the loop and the test's faults
        store.listeners.append(self._on_event)
        self._stop = threading.Event()
        for i, name in enumerate(nodes):
            store.create("nodes", "", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady",
                                           "lastHeartbeatTime": now()}],
                           "addresses": [{"type": "InternalIP", "address": f"127.63.0.{i + 1}"},
                                         {"type": "Hostname", "address": name}]}})
        self.thread = threading.Thread(target=self._loop, name="kubefake-kubelet", daemon=True)
        self.thread.start()

    # -------------------------------------------------------------- the loop

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                with self.lock:
                    self._tick()
            except Exception as e:  # noqa: BLE001 (keep the fake alive; say why)
                print(f"kubefake: {type(e).__name__}: {e}", file=sys.stderr)

    def _tick(self) -> None:
        pods, _ = self.store.list("pods", None)
        nodes = {n["metadata"]["name"]: n for n in self.store.list("nodes", None)[0]}
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            key = (meta["namespace"], meta["name"])
            node = spec.get("nodeName")
            if not node:
                self._schedule(pod, nodes, pods)
                continue
            if node in self.lost_at:
                self._lost_pod(pod)
                continue
            c = self.containers.get(key)
            phase = pod["status"].get("phase")
            if c is None and phase == "Pending":
                if meta.get("deletionTimestamp"):
                    self._remove(key)
                else:
                    self._start(pod)
            elif c is not None:
                self._watch_container(pod, c)
        for key in [k for k in self.containers
                    if k not in {(p["metadata"]["namespace"], p["metadata"]["name"])
                                 for p in pods}]:
            self._kill(self.containers.pop(key), signal.SIGKILL)   # force-deleted
        if self.pod_dns:
            self._write_dns()

    def _on_event(self, kind: str, type_: str, obj: dict) -> None:
        """A pod removed from the API (force-deleted) is killed at once, as a kubelet
        does when it sees the pod gone (the loop would only notice on its next tick)."""
        if kind == "pods" and type_ == "DELETED":
            c = self.containers.get((obj["metadata"]["namespace"], obj["metadata"]["name"]))
            if c is not None and c.proc.poll() is None:
                self._kill(c, signal.SIGKILL)

    def _schedule(self, pod: dict, nodes: dict, pods: list) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            self._remove((pod["metadata"]["namespace"], pod["metadata"]["name"]))
            return
        spec = pod["spec"]
        load = {}
        for p in pods:
            if p["spec"].get("nodeName"):
                load[p["spec"]["nodeName"]] = load.get(p["spec"]["nodeName"], 0) + 1
        fits = [n for n, obj in nodes.items() if n not in self.lost_at
                and _ready(obj) and not obj.get("spec", {}).get("unschedulable")
                and _allows(spec, obj["metadata"].get("labels") or {})]
        key = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if fits:
            chosen = min(fits, key=lambda n: (load.get(n, 0), n))

            def bind(obj):
                obj["spec"]["nodeName"] = chosen
                _condition(obj, "PodScheduled", "True")
            self._update(key, bind)
        elif not any(c.get("reason") == "Unschedulable"
                     for c in pod["status"].get("conditions") or []):
            def unschedulable(obj):
                _condition(obj, "PodScheduled", "False", "Unschedulable",
                           f"0/{len(nodes)} nodes are available: none matches the pod's "
                           "node affinity/selector or is Ready")
            self._update(key, unschedulable)

    def _start(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        key = (meta["namespace"], meta["name"])
        container = spec["containers"][0]
        ip = f"127.64.{self.next_ip // 250}.{self.next_ip % 250 + 1}"
        self.next_ip += 1
        node_ip = next(a["address"] for a in self.store.get("nodes", "", spec["nodeName"])
                       ["status"]["addresses"] if a["type"] == "InternalIP")
        fields = {"status.podIP": ip, "metadata.name": meta["name"],
                  "metadata.namespace": meta["namespace"], "spec.nodeName": spec["nodeName"],
                  "status.hostIP": node_ip}
        env = {}
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "fieldRef" in (e.get("valueFrom") or {}):
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                m = re.match(r"metadata\.labels\['(.+)'\]\Z", path)
                env[e["name"]] = (meta.get("labels") or {}).get(m.group(1), "") if m \
                    else fields.get(path, "")
            else:
                env[e["name"]] = ""      # secretKeyRef / configMapKeyRef: not in the fake
        argv = [expand(a, env) for a in (container.get("command") or []) +
                (container.get("args") or [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        if self.pod_dns:
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f'mount --bind {self.hosts_file} /etc/hosts && exec "$@"', "sh", *argv]
        limit = quantity(((container.get("resources") or {}).get("limits") or {})
                         .get("memory", 0))
        log = open(os.path.join(self.workdir, f"{meta['namespace']}.{meta['name']}.log"), "ab")
        try:
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            log.close()

            def failed(obj):
                obj["status"].update(phase="Failed", podIP=ip, reason="StartError",
                                     message=str(e))
            self._update(key, failed)
            return
        c = self.containers[key] = _Container(proc, limit, log, _probe_port(container), ip)
        c.node = spec["nodeName"]

        def running(obj):
            obj["status"].update(
                phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP=node_ip,
                startTime=now(),
                containerStatuses=[{"name": container["name"], "ready": c.ready,
                                    "restartCount": 0, "image": container.get("image", ""),
                                    "imageID": "", "started": True,
                                    "state": {"running": {"startedAt": now()}}}])
            _condition(obj, "Ready", "True" if c.ready else "False")
        self._update(key, running)

    def _watch_container(self, pod: dict, c: _Container) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        code = c.proc.poll()
        if code is None:
            if c.probe_port and time.monotonic() - c.probed_at > 0.5:
                c.probed_at = time.monotonic()
                try:
                    with socket.create_connection((c.ip, c.probe_port), timeout=0.5):
                        ready = True
                except OSError:
                    ready = False
                if ready != c.ready:
                    c.ready = ready

                    def readiness(obj):
                        for cs in obj["status"].get("containerStatuses") or []:
                            cs["ready"] = ready
                        _condition(obj, "Ready", "True" if ready else "False")
                    self._update(key, readiness)
            if c.limit and not c.oom and _rss(c.proc.pid) > c.limit:
                c.oom = True
                self._kill(c, signal.SIGKILL)
            if meta.get("deletionTimestamp"):
                if c.term_sent is None:
                    c.term_sent = time.monotonic()
                    self._kill(c, signal.SIGTERM)
                elif time.monotonic() - c.term_sent > meta.get("deletionGracePeriodSeconds", 30):
                    self._kill(c, signal.SIGKILL)
            return
        self.containers.pop(key)
        c.log.close()
        sig = -code if code < 0 else 0
        exit_code = 128 + sig if sig else code
        reason = "OOMKilled" if c.oom else ("Completed" if exit_code == 0 else "Error")

        def ended(obj):
            if obj["status"].get("reason") == "Evicted":
                phase = "Failed"
            else:
                phase = "Succeeded" if exit_code == 0 else "Failed"
            terminated = {"exitCode": exit_code, "reason": reason, "startedAt": c.started,
                          "finishedAt": now()}
            if sig:
                terminated["signal"] = sig
            obj["status"]["phase"] = phase
            for cs in obj["status"].get("containerStatuses") or []:
                cs.update(ready=False, started=False, state={"terminated": terminated})
            _condition(obj, "Ready", "False", "PodCompleted")
        self._update(key, ended)
        if meta.get("deletionTimestamp"):
            self._remove(key)

    def _lost_pod(self, pod: dict) -> None:
        """A pod of a lost node: Ready False now; marked for eviction later."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        ready = [c for c in pod["status"].get("conditions") or [] if c["type"] == "Ready"]
        if not ready or ready[0]["status"] != "False":
            self._update(key, lambda o: _condition(o, "Ready", "False", "NodeLost"))
        elif (not meta.get("deletionTimestamp") and time.monotonic()
              - self.lost_at[pod["spec"]["nodeName"]] > self.eviction_seconds
              and pod["status"].get("phase") in ("Pending", "Running")):
            def evict(obj):
                obj["metadata"]["deletionTimestamp"] = now()
                obj["metadata"]["deletionGracePeriodSeconds"] = 30
            self._update(key, evict)

    # -------------------------------------------------------------- helpers

    def _update(self, key, change) -> None:
        try:
            self.store.update("pods", key[0], key[1], change)
        except ApiError:
            pass               # deleted meanwhile

    def _remove(self, key) -> None:
        try:
            self.store.remove("pods", key[0], key[1])
        except ApiError:
            pass

    @staticmethod
    def _kill(c: _Container, sig: int) -> None:
        try:
            os.killpg(c.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _dns_names(self) -> dict:
        names = {}
        services, _ = self.store.list("services", None)
        pods, _ = self.store.list("pods", None)
        for svc in services:
            selector = (svc.get("spec") or {}).get("selector") or {}
            if not selector:
                continue
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            ready = [p for p in pods if p["metadata"]["namespace"] == ns
                     and all((p["metadata"].get("labels") or {}).get(k) == v
                             for k, v in selector.items())
                     and p["status"].get("phase") == "Running" and p["status"].get("podIP")
                     and (svc["spec"].get("publishNotReadyAddresses") or any(
                         c["type"] == "Ready" and c["status"] == "True"
                         for c in p["status"].get("conditions") or []))
                     and not p["metadata"].get("deletionTimestamp")
                     and p["spec"].get("nodeName") not in self.lost_at]
            if ready:
                ip = max(ready, key=lambda p: p["metadata"]["creationTimestamp"]
                         + p["metadata"]["resourceVersion"].zfill(12))["status"]["podIP"]
                for alias in (name, f"{name}.{ns}", f"{name}.{ns}.svc",
                              f"{name}.{ns}.svc.cluster.local"):
                    names[alias] = ip
        return names

    def _write_dns(self) -> None:
        names = self._dns_names()
        if names != self.dns:
            self.dns = names
            text = self.base_hosts + "".join(f"{ip} {n}\n" for n, ip in sorted(names.items()))
            with open(self.hosts_file, "r+") as f:        # in place: bind mounts see it
                f.write(text)
                f.truncate()

    def resolve(self, host: str) -> Optional[str]:
        with self.lock:
            return self._dns_names().get(host)

    # -------------------------------------------------------------- faults

    def lose_node(self, name: str) -> None:
        with self.lock:
            self._lose_node(name)

    def _lose_node(self, name: str) -> None:
        self.lost_at[name] = time.monotonic()
        for key, c in list(self.containers.items()):
            pod = self.store.get("pods", *key)
            if pod["spec"].get("nodeName") == name:
                self._kill(c, signal.SIGKILL)
                self.containers.pop(key)
                c.log.close()

        def unknown(node):
            _condition(node, "Ready", "Unknown", "NodeStatusUnknown",
                       "Kubelet stopped posting node status.")
        self.store.update("nodes", "", name, unknown)

    def evict(self, namespace: str, pod: str, message: str) -> None:
        with self.lock:
            self._evict(namespace, pod, message)

    def _evict(self, namespace: str, pod: str, message: str) -> None:
        def mark(obj):
            obj["status"].update(reason="Evicted", message=message)
        self.store.update("pods", namespace, pod, mark)
        c = self.containers.get((namespace, pod))
        if c is not None:
            self._kill(c, signal.SIGKILL)

    def slow_node(self, name: str, factor: float) -> None:
        """A busy neighbour on node ``name``: every container there gets 1/``factor`` of
        the time (SIGSTOP / SIGCONT in 100 ms periods); factor 1 ends it."""
        with self.lock:
            running = name in self.slow
            if factor <= 1:
                self.slow.pop(name, None)
                return
            self.slow[name] = factor
        if not running:
            threading.Thread(target=self._throttle, args=(name,), daemon=True,
                             name=f"kubefake-slow-{name}").start()

    def _throttle(self, node: str, period: float = 0.1) -> None:
        def signal_all(sig):
            with self.lock:
                pids = [c.proc.pid for c in self.containers.values() if c.node == node]
            for pid in pids:
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        while not self._stop.is_set():
            factor = self.slow.get(node)
            if factor is None:
                break
            signal_all(signal.SIGCONT)
            time.sleep(period / factor)
            signal_all(signal.SIGSTOP)
            time.sleep(period * (1 - 1 / factor))
        signal_all(signal.SIGCONT)

    def kill(self, namespace: str, pod: str, sig: int) -> None:
        with self.lock:
            c = self.containers.get((namespace, pod))
            if c is None:
                raise KeyError(f"no container of pod {namespace}/{pod} runs")
            os.kill(c.proc.pid, sig)

    def pid(self, namespace: str, pod: str) -> Optional[int]:
        with self.lock:
            c = self.containers.get((namespace, pod))
            return c.proc.pid if c is not None and c.proc.poll() is None else None

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        for c in self.containers.values():
            self._kill(c, signal.SIGKILL)
        for c in self.containers.values():
            try:
                c.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            c.log.close()
        self.containers.clear()


def _ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions") or [])


def _condition(obj: dict, type_: str, status: str, reason: str = "", message: str = ""):
    conds = obj["status"].setdefault("conditions", [])
    for c in conds:
        if c["type"] == type_:
            c.update(status=status, reason=reason, message=message, lastTransitionTime=now())
            return
    conds.append({"type": type_, "status": status, "reason": reason, "message": message,
                  "lastTransitionTime": now()})


def _allows(spec: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        ok = True
        for e in term.get("matchExpressions") or []:
            have, values, op = labels.get(e["key"]), e.get("values") or [], e["operator"]
            ok &= {"In": have in values, "NotIn": have not in values,
                   "Exists": e["key"] in labels, "DoesNotExist": e["key"] not in labels
                   }.get(op, False)
        if ok:
            return True
    return False


def pod_dns_available() -> tuple[bool, str]:
    """Whether pods can get the cluster's hosts file (a private mount namespace each)."""
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"no unshare here ({e})"
    if r.returncode != 0:
        return False, f"cannot make a mount namespace: {r.stderr.decode().strip()[:200]}"
    return True, ""


__all__ = ["Kubelets", "matches_labels", "pod_dns_available", "quantity"]
