"""The JobSpec proto is the one description of a job: its defaults live in one table, the
launcher's flags take theirs from it, and the view the runner reads cannot change it."""

import pathlib

import pytest

from antdt_tf.agent.inject import Injection
from antdt_tf.errors import InvalidRequest
from antdt_tf.job.spec import DEFAULTS, Job, new_spec, validate
from antdt_tf.proto import job_pb2 as jpb

# fields whose default is "none given": paths, the local backend's addresses, injections,
# and what the launcher derives (the hosts, the Ray namespace, the TF 2.15 interpreter)
NO_DEFAULT = {"num_hosts", "data", "eval_data", "checkpoint_dir", "workdir", "injections",
              "chief_addresses", "ps_addresses", "worker_addresses", "ray_namespace",
              "task_ports", "estimator_python", "program", "program_args", "code_dir",
              "data_files"}


def test_every_spec_field_has_one_default_or_is_named_as_having_none():
    fields = set(jpb.JobSpec.DESCRIPTOR.fields_by_name)
    assert set(DEFAULTS) <= fields, set(DEFAULTS) - fields
    assert fields - set(DEFAULTS) == NO_DEFAULT


def test_antdt_launch_flags_default_to_the_spec_defaults():
    from absl import flags

    import antdt_tf.launch  # noqa: F401  (defines the flags)

    for name, value in DEFAULTS.items():
        if name in flags.FLAGS:
            assert flags.FLAGS[name].default == value, name


def test_a_job_reads_its_spec_and_cannot_change_it(tmp_path):
    data = tmp_path / "d.adtr"
    data.write_bytes(b"")
    spec = new_spec(data=str(data), workdir=tmp_path, backend="ray", ray_namespace="n", num_hosts=1, num_workers=2,
                    max_workers=4, injections=(Injection("kill", "worker", 1, 5.0),))
    job = Job.of(spec)
    assert job.workdir == pathlib.Path(tmp_path) and job.slots == 4 and job.ray and not job.agents
    assert job.injections == (Injection("kill", "worker", 1, 5.0),)
    assert job.batch_size == DEFAULTS["batch_size"]
    with pytest.raises(AttributeError, match="read-only"):
        job.batch_size = 1
    with pytest.raises(AttributeError, match="no 'nonsense'"):
        job.nonsense  # noqa: B018
    moved = job.replace(workdir=tmp_path / "b", num_workers=3)
    assert (moved.workdir, moved.num_workers, job.num_workers) == (tmp_path / "b", 3, 2)


def test_the_local_backend_needs_an_address_for_every_slot(tmp_path):
    spec = new_spec(data="/x.adtr", workdir=tmp_path, num_hosts=2, num_ps=1, num_workers=2,
                    addresses={"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                               "worker": ["127.0.0.1:3"]})
    validate(spec)          # the addresses are the master's to check, not the launcher's
    with pytest.raises(InvalidRequest, match="needs 2 host:port worker address"):
        Job.of(spec)
    ok = Job(spec).replace(addresses={"worker": ["127.0.0.1:3", "127.0.0.1:4"]}).spec
    assert Job.of(ok).addresses["worker"] == ["127.0.0.1:3", "127.0.0.1:4"]
