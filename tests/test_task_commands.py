"""The one translation of a typed start request into a command line (agent.programs):
every backend builds a task's command here, so a backend never edits an argv."""

import pytest

from antdt_tf.agent.programs import PathPolicy, command_for
from antdt_tf.agent.client import start_request
from antdt_tf.errors import InvalidRequest
from antdt_tf.proto import cluster_pb2 as cpb

PATHS = PathPolicy(job_roots=("/tmp/antdt-job",))


def probe_request(endpoint: str) -> cpb.StartTaskRequest:
    return start_request("worker", 1, cpb.PROBE_TASK, cpb.ProbeTaskArgs(endpoint=endpoint),
                         endpoint=endpoint)


def test_a_probe_binds_its_advertised_endpoint_unless_the_backend_names_its_bind_host():
    assert command_for(probe_request("worker-1:2222"), PATHS).argv[0] == \
        "--endpoint=worker-1:2222"
    # a pod is reached by its Service name but binds its own IP (expanded by Kubernetes)
    command = command_for(probe_request("worker-1:2222"), PATHS, bind_host="$(ANTDT_POD_IP)")
    assert command.argv[0] == "--endpoint=$(ANTDT_POD_IP):2222"
    assert command.module == "antdt_tf.agent.probe_task"


def test_the_bind_host_does_not_reach_other_programs_arguments():
    cluster = cpb.ClusterAddresses(jobs={
        "ps": cpb.ClusterAddresses.Addresses(address=["ps-0:2222"]),
        "worker": cpb.ClusterAddresses.Addresses(address=["worker-0:2222"])})
    req = start_request("ps", 0, cpb.TF_SERVER, cpb.TfServerArgs(job="ps", index=0,
                                                                  cluster=cluster))
    assert command_for(req, PATHS, bind_host="$(ANTDT_POD_IP)") == command_for(req, PATHS)


def test_a_bad_probe_endpoint_is_refused_before_any_bind_host_is_applied():
    with pytest.raises(InvalidRequest, match="probe.endpoint must be host:port"):
        command_for(probe_request("no-port"), PATHS, bind_host="$(ANTDT_POD_IP)")
