"""PsProbe against a real PS process that the agent's throttle stops 2/3 of the time.

The chief's loop wakes when something that needed the PS has just finished; a probe made
right then lands in the PS's running phase and the slow PS looks healthy (the CI failure
that made the probe start after a random delay). Both are measured here, in one chief
process, on the same throttled PS."""

import json
import subprocess
import sys

import pytest

from antdt_tf.agent.throttle import CpuThrottle
from antdt_tf.tf.local_cluster import LocalCluster

pytestmark = pytest.mark.slow

CHIEF = """
import json, sys, time
from antdt_tf.tf.cluster_spec import make_strategy
from antdt_tf.tf.ps_probe import PsProbe
import statistics
spec = json.loads(sys.argv[1])
strategy = make_strategy(spec)
probe = PsProbe(strategy, 1)
synced = PsProbe(strategy, 1, jitter_seconds=0.0)
synced.variables = probe.variables
sync = probe.variables[0]
for _ in range(3):
    probe.measure()          # connections up, first-read costs paid
print("ready", flush=True)
sys.stdin.readline()         # the test has started the throttle
after_sync, jittered = [], []
for _ in range(20):
    sync.read_value().numpy()            # something that waited for the PS ...
    after_sync.append(synced.measure()[0])   # ... and a probe right after it
    time.sleep(0.3)
    sync.read_value().numpy()
    jittered.append(probe.measure()[0])
    time.sleep(0.3)
print(json.dumps({"after_sync": statistics.mean(after_sync),
                  "jittered": statistics.mean(jittered)}), flush=True)
"""


def test_probe_sees_a_throttled_ps_although_the_chief_just_waited_for_it(tmp_path):
    with LocalCluster(num_ps=1, num_workers=1, log_dir=tmp_path) as cluster:
        chief = subprocess.Popen([sys.executable, "-c", CHIEF, cluster.spec_json],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=cluster.env)
        try:
            assert chief.stdout.readline().strip() == "ready"
            with CpuThrottle(cluster.procs["ps", 0].pid, factor=3):
                chief.stdin.write("go\n")
                chief.stdin.flush()
                line = chief.stdout.readline()
            assert chief.wait(timeout=60) == 0
        finally:
            if chief.poll() is None:
                chief.kill()
    means = json.loads(line)
    # stopped 2/3 of every 0.1 s: a probe starting at a random moment waits ~22 ms on
    # average; one starting right after a read of the same PS waits ~nothing
    assert means["jittered"] > 10, means
    assert means["jittered"] > 3 * means["after_sync"], means
