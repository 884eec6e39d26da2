"""ShardFeed's input pipeline (TF1 graph mode) against a real in-process master: what
it reads ahead, and what it must not."""

import collections
import time

import pytest
import tensorflow as tf

from antdt_tf.data import criteo, records
from antdt_tf.estimator.feed import ShardFeed
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState

RECORDS, PER_SHARD, BATCH = 2048, 512, 128   # 4 batches per lease


@pytest.fixture
def master(tmp_path):
    path = tmp_path / "train.adtr"
    records.write_records(path, criteo.generate(criteo.SyntheticSpec(RECORDS, seed=3)))
    with BackgroundMaster(ShardingServicer(ShardState())) as m:
        with ShardingClient(m.address) as admin:
            admin.register_dataset(DatasetSpec("train", records_per_shard=PER_SHARD,
                                               files=(DataFile(str(path), RECORDS),)))
        yield m


def test_a_refused_lease_is_dropped_even_from_batches_read_ahead(master):
    """The pipeline leases, reads and decodes ahead of the step (prefetch), but checks
    for a refused lease when the step takes its batch: a refusal after the lease's first
    batch drops its other three, though they were already read ahead. (Nothing is
    reported here, so the master never ends the epoch: the test takes the other leases'
    batches by count.)"""
    with tf.Graph().as_default():
        feed = ShardFeed(master.address, "train", BATCH, worker=0, worker_wait_seconds=None,
                         worker_device="/cpu:0", prefetch_batches=4)
        iterator = tf.compat.v1.data.make_initializable_iterator(feed.dataset_fn())
        batch = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run([tf.compat.v1.local_variables_initializer(), iterator.initializer])
            first = session.run(batch)["antdt"]["lease"][0]
            # the prefetch buffer fills on tf.data's own thread: wait until the master has
            # leased past the first lease (the buffer then holds its other batches and
            # the next lease's first)
            with ShardingClient(master.address) as admin:
                deadline = time.monotonic() + 60
                while admin.progress("train").datasets[0].doing_shards < 2:
                    assert time.monotonic() < deadline, "the pipeline did not read ahead"
                    time.sleep(0.05)
            session.run(feed.refused_lease.assign(first))
            rest = [session.run(batch)["antdt"]["lease"][0]
                    for _ in range((RECORDS - PER_SHARD) // BATCH)]
    feed.close()
    assert first not in rest
    # every other lease, whole: 3 leases of 4 batches
    assert sorted(collections.Counter(rest).values()) == [4, 4, 4], rest


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be > 0"),
    ({"prefetch_batches": -1}, "prefetch_batches must be >= 0"),
    ({"worker": 64}, "outside the 64 worker slots"),
])
def test_bad_arguments_are_refused(kwargs, message):
    args = dict(master="127.0.0.1:1", dataset="train", batch_size=BATCH, worker=0,
                worker_wait_seconds=None)
    with pytest.raises(ValueError, match=message):
        ShardFeed(**{**args, **kwargs})
