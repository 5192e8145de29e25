"""Process start-up: ``init()`` (Horovod or the direct MPI ops, threads, GPUs), Horovod's tunables, SLURM.

    runtime.py   init() and the job's communicator: Horovod or the direct path once, threads per rank,
                 one GPU per local rank
    tuning.py    horovod_defaults(): the Horovod settings hvd_easgd chooses, one pure function
    slurm.py     SLURM's environment -> ranks and hosts (``python -m hvd_easgd.startup.slurm hosts``)

Imports ``comm`` and the top-level modules only. This file imports nothing, so ``import
hvd_easgd.startup.slurm`` in a batch script costs the standard library only.
"""
