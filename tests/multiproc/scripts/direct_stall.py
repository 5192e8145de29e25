"""Runs under `mpirun -np 2`: how a rank waits for a late partner, then one
that never comes.

Usage: direct_stall.py STALL_SECONDS.

1. Rank 1 reaches an allreduce LATE_SECONDS after rank 0. Rank 0 prints the
   CPU seconds its process used meanwhile: a rank that naps while it waits
   uses a small part of that time, one that polls all of it.
2. Rank 1 never reaches the next collective: the direct communicator must
   abort the job after STALL_SECONDS instead of waiting forever.
"""
import sys
import time

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import tensorflow as tf  # noqa: E402

from hvd_easgd.comm.mpi_direct import DirectMPICommunicator  # noqa: E402

LATE_SECONDS = 1.0

comm = DirectMPICommunicator(stall_seconds=float(sys.argv[1]))
allreduce = tf.function(lambda t: comm.allreduce([t], op="sum"))
allreduce(tf.ones([4]))  # traced and both ranks met once: the timed wait below is only the wait
if comm.rank == 1:
    time.sleep(LATE_SECONDS)
wall, cpu = time.perf_counter(), time.process_time()
allreduce(tf.ones([4]))
if comm.rank == 0:
    print(f"rank 0 waited {time.perf_counter() - wall:.3f} s using {time.process_time() - cpu:.3f} s of CPU",
          flush=True)
if comm.rank == 1:
    time.sleep(60)
    print("rank 1 woke", flush=True)
comm.allreduce([tf.ones([4])], op="sum")
print(f"rank {comm.rank} passed the allreduce", flush=True)
