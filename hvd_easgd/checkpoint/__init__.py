"""Checkpoints and faults: saving and resuming every rank's state, and surviving a stop or a lost rank.

    store.py          the checkpoints themselves: per-rank shards, a manifest written last, exact resume
                      (p -> q too); its names are this package's, so ``checkpoint.save`` / ``checkpoint.latest``
    verification.py   is a checkpoint intact? shard digests, manifest reading, what rotation may delete
    preemption.py     stop requests: a signal or the stop file becomes one checkpoint every rank agrees on
    elastic.py        training through a dead rank under horovodrun's elastic mode: in-memory commits

Imports ``strategies`` and the top-level modules (``atomic``, ``resize``), nothing above them: the callbacks
and the application call it. Importing it loads NumPy, not TensorFlow.
"""
from .store import (FORMAT_VERSION, MANIFEST, CheckpointError, CheckpointSaveError, checkpoint_dir,
                    complete_checkpoints, latest, load_resized, newest_manifest, resize_rules, resized_arrays,
                    restore, save, state_arrays, state_groups)
