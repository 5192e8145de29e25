"""Atomic, complete checkpoints: every rank's state, and a manifest written last.

Under SyncAverage all ranks hold the same state, but under EASGD and
gradient accumulation they do not (local weights, optimizer slots,
accumulators), and a checkpoint without them cannot resume exactly. So each
rank writes its own shard ``rank-NNNNN.npz`` and, once all shards are on
disk, rank 0 writes ``manifest.json``. A checkpoint counts only when its
manifest exists; every file is written under a temporary name and renamed
into place, so a kill in the middle of a write leaves the previous
checkpoint usable.

Layout::

    RUN_DIR/checkpoints/epoch-000003/rank-00000.npz
                                     rank-00001.npz
                                     manifest.json     (last)
    RUN_DIR/checkpoints/epoch-000003-step-000017/...   (3 epochs and 17 micro-batches done)

Directory names sort by global step, as strings and as numbers: an epoch
boundary ``epoch-E`` is step 0 of epoch E, before ``epoch-E-step-S``. The
manifest's ``epoch`` counts whole epochs done and ``step_in_epoch`` the
micro-batches done since (absent in checkpoints written before step
checkpoints existed: read as 0).

The manifest's ``format`` says what the shards mean. It goes up whenever the
meaning of saved state changes, even where the arrays keep their shapes, and
a checkpoint of another format is refused with a message naming both:

- format 1: the first release.
- format 2: one ``sample_count`` contract for every strategy (gradients are
  sums over the counted samples), ``--scale-lr`` by the strategy's
  ``lr_scale_factor`` (accumulation-aware), strategies serialised through ``keras.saving``. A
  format-1 run resumed under these rules would silently train another model.
  Step checkpoints kept format 2: they add the manifest fields
  ``step_in_epoch``, ``global_step`` and ``steps_per_epoch`` (read as 0 and
  absent when missing; ``samples_in_epoch`` only where it is not
  ``step_in_epoch`` · batch · ranks) but the shards mean what they meant; a mid-epoch
  shard simply holds the state at that micro-batch (mid-window accumulators,
  EASGD's step counter and so its tau phase).

A checkpoint saved at p ranks resumes at q != p where the strategy's
``resize_refusal`` allows it, at an epoch end or mid-epoch: ``restore`` then
maps the p shards to this rank's state by the rules the strategy declares for
its state (``resize_rules``; ``hvd_easgd.resize``), and the weights restart
from the variables the strategy names (``resized_weights``: EASGD's center).
``load_resized`` does the same from in-memory per-rank states.
"""
import json
import os
import shutil

import numpy as np

from . import atomic, resize

MANIFEST = "manifest.json"
FORMAT_VERSION = 2


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, of another format, or does not fit this run."""


def state_groups(model, optimizer):
    """Named groups of every variable a resume needs, in a stable order."""
    groups = {"model": list(model.variables), "optimizer": list(optimizer.variables)}
    strategy = getattr(optimizer, "strategy", None)
    if strategy is not None:
        groups["strategy"] = list(strategy.state_variables())
    return groups


def _shard_arrays(groups):
    return {f"{name}/{i:05d}": np.asarray(v.numpy() if hasattr(v, "numpy") else v)
            for name, variables in groups.items() for i, v in enumerate(variables)}


def checkpoint_dir(run_dir, epoch, step_in_epoch=0):
    name = f"epoch-{epoch:06d}" + (f"-step-{step_in_epoch:06d}" if step_in_epoch else "")
    return os.path.join(run_dir, "checkpoints", name)


def _position(name):
    """``(epoch, step_in_epoch)`` from a checkpoint directory's name, None for other names."""
    parts = name.split("-")
    try:
        if len(parts) == 2 and parts[0] == "epoch":
            return int(parts[1]), 0
        if len(parts) == 4 and parts[0] == "epoch" and parts[2] == "step":
            return int(parts[1]), int(parts[3])
    except ValueError:
        pass
    return None


def save(run_dir, epoch, model, optimizer, comm, config, keep=3, step_in_epoch=0, steps_per_epoch=None,
         samples_in_epoch=None):
    """Writes this rank's shard; rank 0 writes the manifest after every rank has.

    ``epoch`` whole epochs and ``step_in_epoch`` micro-batches are done; a
    mid-epoch checkpoint needs ``steps_per_epoch`` (micro-batches per epoch).
    ``samples_in_epoch``: the prefix of the epoch's order seen, where it is not
    ``step_in_epoch`` · batch · ranks (a run resumed mid-epoch at another size).
    """
    if step_in_epoch and not steps_per_epoch:
        raise ValueError("`steps_per_epoch` must be given (micro-batches per epoch) for a mid-epoch checkpoint. "
                         f"Received: steps_per_epoch={steps_per_epoch!r}")
    directory = checkpoint_dir(run_dir, epoch, step_in_epoch)
    os.makedirs(directory, exist_ok=True)
    arrays = _shard_arrays(state_groups(model, optimizer))
    with atomic.temporary_path(os.path.join(directory, f"rank-{comm.rank:05d}.npz")) as tmp:
        np.savez(tmp, **arrays)
    # Every shard is on disk before the manifest makes the checkpoint count.
    ok = comm.allgather_json({"rank": comm.rank, "ok": True})
    outdated = []
    if comm.rank == 0:
        manifest = {"format": FORMAT_VERSION, "epoch": epoch, "step_in_epoch": step_in_epoch,
                    "steps_per_epoch": steps_per_epoch,
                    "global_step": epoch * steps_per_epoch + step_in_epoch if steps_per_epoch else None,
                    "num_ranks": comm.size,
                    **({"samples_in_epoch": samples_in_epoch} if samples_in_epoch is not None else {}),
                    "shards": [f"rank-{r['rank']:05d}.npz" for r in ok], "config": config}
        atomic.write_json(os.path.join(directory, MANIFEST), manifest, indent=1, sort_keys=True)
        outdated = _outdated_checkpoints(run_dir, keep)
    # Rank 0 decides, from the manifests it sees, and the first rank of every host prunes
    # its own view of the run directory: where that is node-local storage, the shards of
    # other hosts never reach rank 0's disk (and no manifest reaches theirs).
    outdated = comm.allgather_json(outdated)[0]
    if comm.local_rank == 0:
        for name in outdated:
            shutil.rmtree(os.path.join(run_dir, "checkpoints", name), ignore_errors=True)
    return directory


def _outdated_checkpoints(run_dir, keep):
    """Directory names of the complete checkpoints beyond the newest ``keep``
    (names, not epochs: an epoch may hold several step checkpoints)."""
    done = complete_checkpoints(run_dir)
    return [os.path.basename(path) for _, path in (done[:-keep] if keep > 0 else [])]


def complete_checkpoints(run_dir):
    """``[(epoch, path)]`` of checkpoints whose manifest exists, oldest first
    (by global step: epoch, then micro-batch within it)."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        position = _position(name)
        if position is not None and os.path.isfile(os.path.join(path, MANIFEST)):
            found.append((position, path))
    return [(epoch, path) for (epoch, _), path in sorted(found)]


def latest(run_dir):
    """The manifest and directory of the newest complete checkpoint in ``run_dir``."""
    done = complete_checkpoints(run_dir)
    if not done:
        raise CheckpointError(f"--resume {run_dir}: no complete checkpoint under {run_dir}/checkpoints")
    _, path = done[-1]
    with open(os.path.join(path, MANIFEST)) as f:
        manifest = json.load(f)
    found = manifest.get("format", "unknown")
    if found != FORMAT_VERSION:
        raise CheckpointError(
            f"--resume {run_dir}: checkpoint format {found}, this hvd_easgd reads format {FORMAT_VERSION} "
            f"(the meaning of saved state changed); resume it with the hvd_easgd release that wrote it, "
            "or start a new run")
    manifest.setdefault("step_in_epoch", 0)  # written before step checkpoints existed
    return manifest, path


def restore(directory, manifest, model, optimizer, comm):
    """Loads this rank's state from the checkpoint in ``directory``.

    At the number of ranks that saved it, each rank loads its own shard. At
    another number (the strategy's ``resize_refusal`` says where that is
    allowed; the trainer checks it first), every rank reads the p saved shards
    and takes its state by the strategy's rules (``load_resized``).
    """
    groups = state_groups(model, optimizer)
    if manifest["num_ranks"] == comm.size:
        path = os.path.join(directory, f"rank-{comm.rank:05d}.npz")
        with np.load(path) as shard:
            _check_fits(path, shard.files, groups)
            _assign(path, groups, shard)
        _strategy_state_restored(optimizer)
        return
    paths = [os.path.join(directory, f"rank-{r:05d}.npz") for r in range(manifest["num_ranks"])]
    states = []
    for path in paths:
        with np.load(path) as shard:
            _check_fits(path, shard.files, groups)
            states.append({key: shard[key] for key in shard.files})
    load_resized(states, model, optimizer, comm.size, comm.rank, source=directory)


def state_arrays(model, optimizer):
    """This rank's state as ``{key: array}``, the keys of a checkpoint's shard
    (what ``load_resized`` takes, one mapping per rank)."""
    return _shard_arrays(state_groups(model, optimizer))


def resize_rules(model, optimizer):
    """``{key: rule}`` for the state whose rule is not ``resize.DEFAULT``: the
    strategy's declared rules (``SyncStrategy.resize_rules``), by shard key."""
    strategy = getattr(optimizer, "strategy", None)
    declared = strategy.resize_rules() if strategy is not None else {}
    rules = {}
    for name, variables in state_groups(model, optimizer).items():
        for i, variable in enumerate(variables):
            if id(variable) in declared:
                rules[f"{name}/{i:05d}"] = declared[id(variable)]
    return rules


def load_resized(states, model, optimizer, ranks, rank, source="the saved state"):
    """Gives this rank (``rank`` of ``ranks``) its state, mapped from the p per-rank ``states``.

    Args:
      states: p mappings ``{key: array}`` in rank order (``state_arrays`` of
        each saved or surviving rank; a checkpoint's shards).
      model, optimizer: this rank's, built, with the strategy bound at
        ``ranks`` ranks (its process groups are those of the new layout).
      ranks: q, the number of ranks the run continues at.
      rank: this rank, 0 <= rank < q.
      source: what ``states`` came from, for error messages.

    Every variable follows the rule its strategy declares (``resize_rules``),
    else ``resize.DEFAULT``; then the strategy reads its restored state
    (``on_state_restored``) and the weights restart from ``resized_weights()``
    where the strategy names some.
    """
    groups = state_groups(model, optimizer)
    _assign(source, groups, resize.resized_state(states, resize_rules(model, optimizer), ranks, rank))
    _strategy_state_restored(optimizer)
    _restart_weights(model, optimizer)


def _strategy_state_restored(optimizer):
    # A strategy whose saved state changed meaning reads an older checkpoint's here.
    strategy = getattr(optimizer, "strategy", None)
    if strategy is not None:
        strategy.on_state_restored()


def _keys(groups):
    return [f"{name}/{i:05d}" for name, variables in groups.items() for i in range(len(variables))]


def _check_fits(path, files, groups):
    expected = set(_keys(groups))
    if expected != set(files):
        missing = sorted(expected - set(files))[:3]
        extra = sorted(set(files) - expected)[:3]
        raise CheckpointError(f"{path} does not fit this model/optimizer/strategy "
                              f"(missing {missing}, unexpected {extra})")


def _assign(path, groups, arrays):
    for name, variables in groups.items():
        for i, var in enumerate(variables):
            value = arrays[f"{name}/{i:05d}"]
            if tuple(value.shape) != tuple(var.shape):
                raise CheckpointError(f"{path}: {name}/{i} has shape {value.shape}, expected {tuple(var.shape)}")
            var.assign(value)


def resized_arrays(shards, keys):
    """One state for every rank from the p saved ``shards`` (mappings of key ->
    array), every key by ``resize.DEFAULT``: kept where the shards agree, else
    the mean of floating arrays, else rank 0's (``resize``'s module docstring)."""
    return resize.resized_state([{key: shard[key] for key in keys} for shard in shards], {}, 1, 0)


def _restart_weights(model, optimizer):
    """Every rank's trainable weights <- the strategy's ``resized_weights()``
    (EASGD's center), where it names some (None: the weights keep their rule's values)."""
    strategy = getattr(optimizer, "strategy", None)
    start = strategy.resized_weights() if strategy is not None else None
    if start is None:
        return
    for variable, value in zip(model.trainable_variables, start):
        variable.assign(value)
