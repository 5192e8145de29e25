"""Runs under `mpirun -np 2`: rank 1 never reaches the collective rank 0 waits in.

Usage: direct_stall.py STALL_SECONDS. The direct communicator must abort the
job after STALL_SECONDS instead of waiting forever.
"""
import sys
import time

import tensorflow as tf

from hvd_easgd.comm.mpi_direct import DirectMPICommunicator

comm = DirectMPICommunicator(stall_seconds=float(sys.argv[1]))
if comm.rank == 1:
    time.sleep(60)
    print("rank 1 woke", flush=True)
comm.allreduce([tf.ones([4])], op="sum")
print(f"rank {comm.rank} passed the allreduce", flush=True)
