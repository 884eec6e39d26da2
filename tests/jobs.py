"""A local PSS job for the multi-process tests: generated train + held-out data, an
in-process master with the dataset registered, and real PS/worker processes."""

import contextlib

from antdt_tf.data import criteo, records
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.sharding.service import BackgroundMaster, ShardingServicer
from antdt_tf.sharding.state import ShardState
from antdt_tf.tf.local_cluster import LocalCluster


@contextlib.contextmanager
def local_pss_job(tmp_path, num_records: int, eval_records: int, seed: int,
                  records_per_shard: int = 1024, num_workers: int = 2):
    """Yields ``(master, cluster, admin, flags)``; ``flags`` point the chief at the
    held-out data."""
    data, held_out = tmp_path / "train.adtr", tmp_path / "eval.adtr"
    n = num_records
    batches = list(criteo.generate(criteo.SyntheticSpec(n + eval_records, seed=seed)))
    records.write_records(data, [criteo.Batch(b.label[:n], b.dense[:n], b.sparse[:n])
                                 for b in batches])
    records.write_records(held_out, [criteo.Batch(b.label[n:], b.dense[n:], b.sparse[n:])
                                     for b in batches])
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            LocalCluster(num_ps=1, num_workers=num_workers, log_dir=tmp_path) as cluster, \
            ShardingClient(master.address) as admin:
        admin.register_dataset(DatasetSpec("train", records_per_shard=records_per_shard,
                                           files=(DataFile(str(data), n),)))
        yield master, cluster, admin, [f"--eval_data={held_out}"]
