"""``TimedCheckpointSaverHook`` (what ``ShardFeed.chief_hooks(save_secs=...)`` returns):
TF's ``CheckpointSaverHook`` whose steps fetch nothing; it still saves at the start, by
the clock and at the end, and calls its listeners around every save. A real TF1
``MonitoredSession`` writing real checkpoint files."""

import time

import pytest

tf = pytest.importorskip("tensorflow")


class Listener(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self):
        self.before, self.after, self.times, self.ended = [], [], [], None

    def before_save(self, session, global_step_value):
        self.before.append(int(global_step_value))

    def after_save(self, session, global_step_value):
        self.after.append(int(global_step_value))
        self.times.append(time.monotonic())

    def end(self, session, global_step_value):
        self.ended = int(global_step_value)


def test_saves_at_start_by_the_clock_and_at_the_end_and_fetches_nothing_per_step(tmp_path):
    from antdt_tf.estimator.hooks import TimedCheckpointSaverHook

    save_secs = 0.3
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = step.assign_add(1)
        listener = Listener()
        hook = TimedCheckpointSaverHook(str(tmp_path), save_secs, listeners=[listener])
        with tf.compat.v1.train.MonitoredSession(
                session_creator=tf.compat.v1.train.ChiefSessionCreator(),
                hooks=[hook]) as sess:
            assert listener.after == [0]          # the save at the start
            # the hook asks for nothing with the step (TF's fetches global_step)
            assert hook.before_run(None) is None
            deadline = time.monotonic() + 120
            while len(listener.after) < 4 and time.monotonic() < deadline:
                sess.run(train_op)
                time.sleep(0.002)
            for _ in range(3):        # steps after the last save: the end saves them
                last = sess.run(train_op)
    assert len(listener.after) >= 5, listener.after   # start, >= 3 by the clock, end
    assert listener.before == listener.after
    assert listener.after[-1] == listener.ended == last   # the save at the end
    assert listener.after == sorted(set(listener.after))
    gaps = [b - a for a, b in zip(listener.times[:4], listener.times[1:4])]
    assert min(gaps) >= save_secs * 0.9, gaps      # by the clock, not every step
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert state.model_checkpoint_path.endswith(f"model.ckpt-{last}")
    assert (tmp_path / "graph.pbtxt").exists()


def test_chief_hooks_pick_the_timed_hook_for_seconds_and_tfs_for_steps(tmp_path):
    from antdt_tf.estimator import ShardFeed
    from antdt_tf.estimator.hooks import TimedCheckpointSaverHook

    feed = ShardFeed("127.0.0.1:1", "train", 8, worker=0, worker_wait_seconds=None)
    try:
        (timed,) = feed.chief_hooks(str(tmp_path), save_secs=10)
        (steps,) = feed.chief_hooks(str(tmp_path), save_steps=100)
    finally:
        feed.close()
    assert isinstance(timed, TimedCheckpointSaverHook)
    assert type(steps) is tf.compat.v1.train.CheckpointSaverHook
