"""Ray's settings that matter to antdt-tf, in one place, without importing Ray (Ray
reads them when it is first imported in a process, so they must be in the environment
before that import; docs/ray.md explains each)."""

# every node and driver of a cluster antdt-tf runs on: token authentication, no usage
# stats, and on Linux nodes on the address they are given (without
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 a cluster started on one machine advertises, and
# is sought at, the machine's LAN address)
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# a dead node declared dead in ~2 s instead of ~15 s (the GCS reads them at its start)
FAST_HEALTH_CHECKS = {"RAY_health_check_initial_delay_ms": "1000",
                      "RAY_health_check_period_ms": "500",
                      "RAY_health_check_timeout_ms": "1000",
                      "RAY_health_check_failure_threshold": "3"}

# a node's host name for antdt-tf: ray start --labels='{"antdt-host": "h1"}'
HOST_LABEL = "antdt-host"

# TF task ports: outside Ray's worker ports (10002-19999 by default) and below the
# kernel's ephemeral range (Ray's own servers bind ephemeral ports)
DEFAULT_TASK_PORTS = (23000, 23999)
