"""PsProbe against a real PS process that the agent's throttle stops 2/3 of the time.

The chief's loop wakes when something that needed the PS has just finished; a probe made
right then lands in the PS's running phase and the slow PS looks healthy (the CI failure
that made the probe start after a random delay). Both are measured here, in one chief
process, on the same PS — in rounds that alternate throttled and free, so every
throttled measurement has a baseline taken under the same load: what a loaded machine
adds to a read (both) is not what the throttle adds (the difference)."""

import json
import subprocess
import sys

import pytest

from antdt_tf.agent.throttle import CpuThrottle
from antdt_tf.tf.local_cluster import LocalCluster

pytestmark = pytest.mark.slow
ROUNDS = 16

CHIEF = """
import json, sys, time
from antdt_tf.tf.cluster_spec import make_strategy
from antdt_tf.tf.ps_probe import PsProbe
spec = json.loads(sys.argv[1])
strategy = make_strategy(spec)
probe = PsProbe(strategy, 1)
synced = PsProbe(strategy, 1, jitter_seconds=0.0)
synced.variables = probe.variables
sync = probe.variables[0]
for _ in range(3):
    probe.measure()          # connections up, first-read costs paid
print("ready", flush=True)
for _ in sys.stdin:          # a round: the test has started (or not) the throttle
    sync.read_value().numpy()            # something that waited for the PS ...
    after_sync = synced.measure()[0]     # ... and a probe right after it
    time.sleep(0.3)
    sync.read_value().numpy()
    jittered = probe.measure()[0]
    print(json.dumps({"after_sync": after_sync, "jittered": jittered}), flush=True)
"""


def test_probe_sees_a_throttled_ps_although_the_chief_just_waited_for_it(tmp_path):
    rounds = {True: [], False: []}      # throttled? -> the chief's measurements
    with LocalCluster(num_ps=1, num_workers=1, log_dir=tmp_path) as cluster:
        chief = subprocess.Popen([sys.executable, "-c", CHIEF, cluster.spec_json],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=cluster.env)
        try:
            assert chief.stdout.readline().strip() == "ready"
            for k in range(2 * ROUNDS):
                throttled = k % 2 == 0
                throttle = CpuThrottle(cluster.procs["ps", 0].pid, factor=3 if throttled else 1)
                with throttle:
                    chief.stdin.write("round\n")
                    chief.stdin.flush()
                    line = chief.stdout.readline()
                assert line, "the chief ended"
                rounds[throttled].append(json.loads(line))
            chief.stdin.close()
            assert chief.wait(timeout=60) == 0
        finally:
            if chief.poll() is None:
                chief.kill()

    def mean(throttled, kind):
        return sum(r[kind] for r in rounds[throttled]) / len(rounds[throttled])
    # what the throttle adds, over the same reads without it
    jittered = mean(True, "jittered") - mean(False, "jittered")
    after_sync = mean(True, "after_sync") - mean(False, "after_sync")
    # stopped 2/3 of every 0.1 s: a probe starting at a random moment waits ~22 ms more
    # on average; one starting right after a read of the same PS lands in its running
    # phase and waits ~nothing more
    assert jittered > 10, rounds
    assert jittered > 3 * after_sync, (jittered, after_sync, rounds)
