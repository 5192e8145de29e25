"""Starts Horovod, proves the ranks can talk, then keeps the job alive until
the test has looked at its sockets: argv = READY_FILE RELEASE_FILE."""
import os
import sys
import time

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

ready_file, release_file = sys.argv[1:3]
hvd.init()
total = int(hvd.allreduce(tf.constant(hvd.rank() + 1), op=hvd.Sum).numpy())
assert total == hvd.size() * (hvd.size() + 1) // 2, total
if hvd.rank() == 0:
    with open(ready_file, "w") as f:
        f.write(str(total))
deadline = time.monotonic() + 90  # never outlive a test that forgot to release us
while not os.path.exists(release_file) and time.monotonic() < deadline:
    time.sleep(0.2)
hvd.allreduce(tf.constant(0))  # both ranks leave together
