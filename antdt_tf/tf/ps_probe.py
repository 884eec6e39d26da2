"""PsProbe: how long a parameter server takes to answer, as seen from the chief.

A PS has no batches of its own, so its batch processing time cannot be measured; what
workers suffer from a slow PS is the wait on its reads and updates. The probe times a
read of a tiny variable placed on each PS (a full round trip through that PS's
executor), once per call: the Monitor averages calls made about a second apart. Probes
made back to back are useless against a task that is stopped and resumed (a contended
host, or our SIGSTOP/SIGCONT throttle): the first waits for the resume, the rest land in
the running phase. For the same reason a probe must not start right after something
that waited for the PS: the chief's loop wakes when a closure ends (its last step needed
every PS) and reads the per-worker counters from a PS just before it reports, so a probe
made then lands in the PS's running phase every time and a PS stopped 2/3 of the time
looked healthy (seen in CI once the machine got faster and closures ended more often).
Each read therefore starts after a random delay of up to ``jitter_seconds`` (at least one
stop/run period: 0.1 s is both our throttle's and the kernel CFS quota period), which
makes its start independent of the PS's phase. It runs on the chief's main thread, beside
the other remote reads (concurrent remote reads from several threads crashed TF here);
the delay should cost no training time: every worker has a second closure queued.
"""

from __future__ import annotations

import random
import re
import time

import tensorflow as tf


def ps_index(device: str) -> int:
    m = re.search(r"/job:ps/(?:replica:\d+/)?task:(\d+)", device)
    return int(m.group(1)) if m else -1


class PsProbe:
    def __init__(self, strategy, num_ps: int, jitter_seconds: float = 0.1,
                 rng: random.Random | None = None):
        self.jitter_seconds = jitter_seconds
        self._rng = rng or random.Random()
        self.variables: dict[int, tf.Variable] = {}
        with strategy.scope():
            # PSS places unpartitioned variables round-robin over the PS: create until
            # every PS holds one (a few extra at most)
            for n in range(4 * num_ps):
                v = tf.Variable(0.0, trainable=False, name=f"antdt_ps_probe_{n}")
                i = ps_index(v.device)
                if i >= 0 and i not in self.variables:
                    self.variables[i] = v
                if len(self.variables) == num_ps:
                    break
        if len(self.variables) != num_ps:
            raise RuntimeError(f"could not place a probe variable on every PS: "
                               f"{sorted(self.variables)} of {num_ps}")

    def measure(self) -> dict[int, float]:
        """Read latency (ms) per PS. Raises what TF raises for a PS that is gone."""
        out = {}
        for i, v in sorted(self.variables.items()):
            time.sleep(self._rng.uniform(0.0, self.jitter_seconds))
            t0 = time.perf_counter()
            v.read_value().numpy()
            out[i] = (time.perf_counter() - t0) * 1e3
        return out
