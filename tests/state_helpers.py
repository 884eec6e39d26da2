"""Helpers shared by the pure ``ShardState`` tests (test_state, test_sparse_reports)."""

from antdt_tf.proto import sharding_pb2 as pb


class Clock:
    """A settable clock for ``ShardState(clock=...)``: lease expiry without sleeping."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def W(index, incarnation=0):
    return pb.TaskId(type="worker", index=index, incarnation=incarnation)


def progress(state, dataset="train"):
    return state.progress(dataset).datasets[0]
