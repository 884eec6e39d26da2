"""The chief of keras_examples.own_model with one test hook: while ``--block_file``
exists, the chief's main thread waits in a callback (and says so in
``<block_file>.waiting``) (as it would in a long checkpoint join, an evaluation or a user's own slow callback) — so a test can kill a worker while
the chief cannot settle anything."""

import os
import time

from absl import app, flags

from keras_examples import own_model

flags.DEFINE_string("block_file", "", "While this file exists, the chief's main thread waits.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import tensorflow as tf

    from antdt_tf.tf.tf_internals import accept_remote_logs

    class BlockWhileFileExists(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            accept_remote_logs(self)   # under PSS: no fetch of every step's logs

        def on_train_batch_end(self, batch, logs=None):
            if not (FLAGS.block_file and os.path.exists(FLAGS.block_file)):
                return
            with open(FLAGS.block_file + ".waiting", "w"):   # tell the test: blocked now
                pass
            while os.path.exists(FLAGS.block_file):
                time.sleep(0.05)

    own_model.train(extra_callbacks=[BlockWhileFileExists()])


if __name__ == "__main__":
    app.run(main)
