"""A network of the job's own on one machine: a Linux network namespace.

TensorFlow's servers listen on every interface and authenticate no one (a
``tf.distribute.Server`` told ``127.0.0.1:P`` listens on ``*:P``, and serves graph
execution, file reads and writes included). A local job therefore runs its agents, its
master and every TF task inside a private network namespace: there they talk over the
namespace's own loopback, and nothing outside the namespace — no other user of the
machine, no other host — can reach any of their ports. The launcher, outside, talks to
the master over a Unix socket in the job's directory (file permissions guard it).

Two ways to get one, tried in this order:

- ``ip netns`` (root): a named namespace (``adtjob-<pid>-<n>``), removed on ``close``;
- an unprivileged user namespace (``unshare --user --map-root-user --net``, where the
  kernel allows it): a holder process owns the namespace; processes join it with
  ``nsenter``. The namespace ends with the holder.

Where neither works, :func:`create` says why and the caller decides (the launcher then
runs on the machine's loopback and says so).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from typing import Optional

_COUNT = itertools.count()
# the holder of an unprivileged namespace: brings loopback up, then waits for its
# parent (the launcher) to go; PR_SET_PDEATHSIG via antdt_tf's import takes it down
_HOLDER = ("import os, signal, subprocess, sys\n"
           "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
           "import antdt_tf\n"
           "print('ready', flush=True)\n"
           "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
           "while True: signal.pause()\n")


class PrivateNetwork:
    """A network namespace the job's processes run in (:meth:`command`)."""

    def __init__(self, kind: str, name: str = "", holder: Optional[subprocess.Popen] = None):
        self.kind, self.name, self.holder = kind, name, holder

    def command(self, argv: list) -> list:
        """``argv`` run inside the namespace (the same process: both tools exec it, so
        its pid, process group and parent are what the caller sees)."""
        if self.kind == "netns":
            return ["ip", "netns", "exec", self.name, *argv]
        return ["nsenter", f"--target={self.holder.pid}", "--user", "--net",
                "--preserve-credentials", "--", *argv]

    def close(self) -> None:
        if self.kind == "netns":
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        elif self.holder is not None and self.holder.poll() is None:
            self.holder.terminate()
            self.holder.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __str__(self):
        return (f"network namespace {self.name}" if self.kind == "netns"
                else f"user+network namespace of pid {self.holder.pid}")


def create(prefer: str = "") -> tuple[Optional[PrivateNetwork], str]:
    """A new private network, or (None, why not). ``prefer``: "netns" or "userns" to
    try only that way (tests)."""
    if shutil.which("ip") is None:
        return None, "iproute2's ip is not installed"
    reasons = []
    if prefer in ("", "netns"):
        if os.geteuid() == 0:
            name = f"adtjob-{os.getpid()}-{next(_COUNT)}"
            made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
            if made.returncode == 0:
                up = subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"],
                                    capture_output=True, text=True)
                if up.returncode == 0:
                    return PrivateNetwork("netns", name), ""
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
                reasons.append(f"ip -n {name} link set lo up: {up.stderr.strip()}")
            else:
                reasons.append(f"ip netns add: {made.stderr.strip()}")
        else:
            reasons.append("ip netns needs root")
    if prefer in ("", "userns"):
        network, why = _user_namespace()
        if network is not None:
            return network, ""
        reasons.append(why)
    return None, "; ".join(reasons)


def _user_namespace() -> tuple[Optional[PrivateNetwork], str]:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return None, "unshare/nsenter (util-linux) are not installed"
    from antdt_tf.procutil import child_env

    holder = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--net", "--", sys.executable, "-c", _HOLDER],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=child_env(), start_new_session=True)
    line = holder.stdout.readline().strip()
    if line != "ready":
        holder.kill()
        _, err = holder.communicate(timeout=10)
        return None, f"user namespaces: {(err or line).strip().splitlines()[-1:] or 'no'}"
    # nsenter --target needs the holder's namespaces, not unshare's: the holder is
    # unshare's exec'd child process image (unshare execs), so the pid is the same
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.readlink(
            f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        time.sleep(0.01)
    return PrivateNetwork("userns", holder=holder), ""
