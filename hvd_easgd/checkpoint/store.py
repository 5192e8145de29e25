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
                                     manifest.json     (last; with each shard's size and SHA-256)
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

Each shard's size and SHA-256 go in the manifest (``checksums``), and a
resume trusts nothing it has not checked: ``latest`` tries the checkpoints
newest first, every rank verifies what it would read
(``checkpoint_verification``), and the ranks agree on the verdict, so a
damaged or interrupted checkpoint is skipped by all of them for the newest
intact one. Rotation (``keep``) counts only intact checkpoints. A save that
fails on any rank (a full or read-only disk) fails on every rank
(``CheckpointSaveError``) and leaves nothing of itself behind. The checksums
kept format 2: they describe the shards, whose meaning is unchanged, and a
manifest without them (an older release's) is still read, its shards checked
by their zip CRC-32s.

A checkpoint saved at p ranks resumes at q != p where the strategy's
``resize_refusal`` allows it, at an epoch end or mid-epoch: ``restore`` then
maps the p shards to this rank's state by the rules the strategy declares for
its state (``resize_rules``; ``hvd_easgd.resize``), and the weights restart
from the variables the strategy names (``resized_weights``: EASGD's center).
``load_resized`` does the same from in-memory per-rank states. The manifest
names the strategy's process groups (``process_groups``; Hierarchical's), and
a resume in other groups is mapped alike, at the same number of ranks too;
a strategy whose state changes shape with its groups first reads the saved
entries in its own layout (``saved_state_in_layout``).
"""
import contextlib
import io
import os
import shutil
import threading

import numpy as np

from .. import atomic, resize
from .verification import MANIFEST, ManifestProblem, buffer_digest, outdated, problem, read_manifest, shards_read_by

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


class CheckpointSaveError(CheckpointError):
    """A save failed on some rank (a full or read-only disk): no rank wrote the
    manifest, every rank removed its shard, and the previous checkpoint is intact.

    Attributes:
      name: the checkpoint directory's name (``epoch-000002``).
      reason: which rank failed and why, in a few words.
    """

    def __init__(self, name, reason):
        super().__init__(f"checkpoint {name} not saved: {reason}")
        self.name, self.reason = name, reason


def _os_reason(err):
    # "[Errno 28] No space left on device", without the temporary file's path.
    return f"[Errno {err.errno}] {err.strerror}" if err.errno and err.strerror else str(err)


def save(run_dir, epoch, model, optimizer, comm, config, keep=3, step_in_epoch=0, steps_per_epoch=None,
         samples_in_epoch=None):
    """Writes this rank's shard; rank 0 writes the manifest after every rank has.

    ``epoch`` whole epochs and ``step_in_epoch`` micro-batches are done; a
    mid-epoch checkpoint needs ``steps_per_epoch`` (micro-batches per epoch).
    ``samples_in_epoch``: the prefix of the epoch's order seen, where it is not
    ``step_in_epoch`` · batch · ranks (a run resumed mid-epoch at another size).
    Every rank reports how its write went, with its shard's size and SHA-256,
    in one ``allgather_json``; rank 0 reports the manifest's in a second.

    Returns:
      The checkpoint's directory.

    Raises:
      CheckpointSaveError: on every rank alike, when any rank failed to write
        (``OSError``: a full or read-only disk); nothing of this checkpoint stays.
    """
    if step_in_epoch and not steps_per_epoch:
        raise ValueError("`steps_per_epoch` must be given (micro-batches per epoch) for a mid-epoch checkpoint. "
                         f"Received: steps_per_epoch={steps_per_epoch!r}")
    strategy = getattr(optimizer, "strategy", None)
    if strategy is not None:
        strategy.drain()  # a synchronisation in flight is merged first: a saved state holds nothing pending
    directory = checkpoint_dir(run_dir, epoch, step_in_epoch)
    name, file = os.path.basename(directory), f"rank-{comm.rank:05d}.npz"
    arrays = _shard_arrays(state_groups(model, optimizer))
    try:
        written = {"rank": comm.rank, "file": file, **_write_shard(directory, file, arrays)}
    except OSError as err:
        written = {"rank": comm.rank, "error": _os_reason(err)}
    # Every shard is on disk before the manifest makes the checkpoint count, and
    # every rank learns whether any write failed: none waits for a manifest that never comes.
    shards = comm.allgather_json(written)
    _raise_if_failed(shards, directory, file, comm)
    report, groups = None, _process_groups(optimizer)
    if comm.rank == 0:
        manifest = {"format": FORMAT_VERSION, "epoch": epoch, "step_in_epoch": step_in_epoch,
                    "steps_per_epoch": steps_per_epoch,
                    "global_step": epoch * steps_per_epoch + step_in_epoch if steps_per_epoch else None,
                    "num_ranks": comm.size,
                    # Which ranks formed the strategy's groups: a resume in other groups maps the state.
                    **({"process_groups": groups} if groups is not None else {}),
                    **({"samples_in_epoch": samples_in_epoch} if samples_in_epoch is not None else {}),
                    "shards": [s["file"] for s in shards],
                    "checksums": {s["file"]: {"bytes": s["bytes"], "sha256": s["sha256"]} for s in shards},
                    "config": config}
        try:
            atomic.write_json(os.path.join(directory, MANIFEST), manifest, indent=1, sort_keys=True)
        except OSError as err:
            report = {"rank": 0, "error": f"{MANIFEST}: {_os_reason(err)}"}
        else:
            report = {"candidates": _rotation_candidates(run_dir, keep, name)}
    report = comm.allgather_json(report)[0]
    _raise_if_failed([report], directory, file, comm)
    _rotate(run_dir, report["candidates"], keep, comm)
    return directory


def _write_shard(directory, file, arrays):
    """Writes ``arrays`` to ``directory/file`` atomically; returns its size and SHA-256.

    The archive is built in memory and written in one call: numpy's zip writer,
    failing on a full disk, leaves a half-closed ZipFile whose finaliser prints a
    traceback at exit. The copy in memory also gives the digest without reading
    the file back.
    """
    os.makedirs(directory, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with atomic.temporary_path(os.path.join(directory, file)) as tmp:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
    return buffer_digest(buffer.getbuffer())


def _raise_if_failed(reports, directory, file, comm):
    """On a failed write, every rank removes its shard (room for the next save) and raises alike."""
    failed = [r for r in reports if "error" in r]
    if not failed:
        return
    with contextlib.suppress(OSError):
        os.remove(os.path.join(directory, file))
    comm.allgather_json(None)  # every shard is gone before the directory is removed
    if comm.local_rank == 0:
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # only if empty: an older manifest there stays a damaged checkpoint
    reason = "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed[:2])
    if len(failed) > 2:
        reason += f" (and {len(failed) - 2} more ranks)"
    raise CheckpointSaveError(os.path.basename(directory), reason)


def _rotation_candidates(run_dir, keep, newest):
    """Rank 0's view of the checkpoints rotation weighs, oldest first: ``[name,
    manifest or reason]``; empty when there are no more than ``keep`` (nothing to delete).
    ``newest`` was checked as it was written: its manifest is not sent again."""
    done = complete_checkpoints(run_dir)
    if keep <= 0 or len(done) <= keep:
        return []
    candidates = []
    for _, path in done:
        name = os.path.basename(path)
        if name == newest:
            candidates.append([name, None])
            continue
        try:
            manifest = read_manifest(path)
            candidates.append([name, {k: manifest.get(k) for k in ("num_ranks", "shards", "checksums")}])
        except ManifestProblem as err:
            candidates.append([name, str(err)])
    return candidates


def _rotate(run_dir, candidates, keep, comm):
    """Deletes what ``verification.outdated`` says, counting only intact checkpoints.

    Each rank checks the shards ``i`` with ``i % size == rank`` of every
    candidate (its own, at the saved number of ranks), in one ``allgather_json``
    of verdicts; the first rank of every host then prunes its own view of the
    run directory: where that is node-local storage, the shards of other hosts
    never reach rank 0's disk (and no manifest reaches theirs).
    """
    if not candidates:
        return
    root = os.path.join(run_dir, "checkpoints")
    mine = {}
    for name, manifest in candidates:
        if isinstance(manifest, dict):
            files = [f for i, f in enumerate(manifest["shards"]) if i % comm.size == comm.rank]
            mine[name] = problem(os.path.join(root, name), manifest, files)
    views = comm.allgather_json(mine)
    verdicts = []
    for name, manifest in candidates:
        reasons = [view.get(name) for view in views if view.get(name)]
        verdicts.append((name, manifest if isinstance(manifest, str) else (reasons[0] if reasons else None)))
    if comm.local_rank == 0:
        for name in outdated(verdicts, keep):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def complete_checkpoints(run_dir):
    """``[(epoch, path)]`` of checkpoints whose manifest exists, oldest first
    (by global step: epoch, then micro-batch within it). Whether they are intact
    is ``latest``'s question."""
    return [(position[0], path) for position, path in _checkpoint_dirs(run_dir)
            if os.path.isfile(os.path.join(path, MANIFEST))]


def _checkpoint_dirs(run_dir):
    """``[((epoch, step_in_epoch), path)]`` of every checkpoint directory, complete or not, oldest first."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    found = [(_position(name), os.path.join(root, name)) for name in os.listdir(root)]
    return sorted((position, path) for position, path in found if position is not None and os.path.isdir(path))


def _check_format(run_dir, manifest):
    found = manifest.get("format", "unknown")
    if found != FORMAT_VERSION:
        raise CheckpointError(
            f"--resume {run_dir}: checkpoint format {found}, this hvd_easgd reads format {FORMAT_VERSION} "
            f"(the meaning of saved state changed); resume it with the hvd_easgd release that wrote it, "
            "or start a new run")


def newest_manifest(run_dir):
    """The manifest of the newest checkpoint whose manifest parses (its format
    checked), without reading any shard: what a resumed run's options default to
    before the ranks start (every checkpoint of a run holds the same options,
    but for the resumable ones). ``latest`` then picks the intact one to load."""
    for _, path in reversed(_checkpoint_dirs(run_dir)):
        try:
            manifest = read_manifest(path)
        except ManifestProblem:
            continue
        _check_format(run_dir, manifest)
        return manifest
    raise CheckpointError(f"--resume {run_dir}: no complete checkpoint under {run_dir}/checkpoints")


def latest(run_dir, comm=None, report=None):
    """The manifest and directory of the newest intact checkpoint in ``run_dir``.

    Newest first, every rank checks what it would read of a checkpoint (its
    manifest, and its shard or, at another number of ranks, every shard) and the
    ranks agree on the verdict in one ``allgather_json``, so either all of them
    load it or all skip it. Without ``comm``, one process checks every shard.

    Args:
      run_dir: the run directory.
      comm: the ranks' communicator (None: this process alone, reading every shard).
      report: called with one line per checkpoint skipped (and why), and for a
        checkpoint without checksums; None: silent. Called on every rank alike.

    Returns:
      ``(manifest, directory)``.

    Raises:
      CheckpointError: no checkpoint is intact (every reason named), or the
        newest one whose manifest parses is of another format. On every rank alike.
    """
    report = report or (lambda line: None)
    paths = [path for _, path in _checkpoint_dirs(run_dir)]
    if comm is not None and comm.size > 1:
        # Rank 0's listing: a network file system may show another rank a stale one.
        names = comm.allgather_json([os.path.basename(p) for p in paths])[0]
        paths = [os.path.join(run_dir, "checkpoints", name) for name in names]
    if not paths:
        raise CheckpointError(f"--resume {run_dir}: no complete checkpoint under {run_dir}/checkpoints")
    skipped = []
    for path in reversed(paths):
        manifest, verdict = _own_verdict(run_dir, path, comm)
        if comm is not None and comm.size > 1:
            verdicts = comm.allgather_json(verdict)
            verdict = next((v for v in verdicts if v and "refuse" in v), None) or next(
                (v for v in verdicts if v), None)
        if verdict and "refuse" in verdict:
            raise CheckpointError(verdict["refuse"])
        name = os.path.basename(path)
        if verdict:
            skipped.append((name, verdict["skip"]))
            report(f"skipping checkpoint {name}: {verdict['skip']}")
            continue
        if "checksums" not in manifest:
            report(f"checkpoint {name} has no checksums (written before hvd_easgd recorded them): "
                   "its shards were checked by their zip CRC-32s")
        manifest.setdefault("step_in_epoch", 0)  # written before step checkpoints existed
        return manifest, path
    shown = "; ".join(f"{name}: {reason}" for name, reason in skipped[:3])
    more = f"; and {len(skipped) - 3} older ones" if len(skipped) > 3 else ""
    raise CheckpointError(f"--resume {run_dir}: no intact checkpoint under {run_dir}/checkpoints ({shown}{more})")


def _own_verdict(run_dir, path, comm):
    """``(manifest, None)`` when what this rank reads of ``path`` is intact, else
    ``(None, {"skip": reason})``, or ``{"refuse": message}`` for another format."""
    try:
        manifest = read_manifest(path)
        _check_format(run_dir, manifest)
    except ManifestProblem as err:
        return None, {"skip": str(err)}
    except CheckpointError as err:
        return None, {"refuse": str(err)}
    files = None if comm is None else shards_read_by(manifest, comm.rank, comm.size)
    reason = problem(path, manifest, files)
    return (None, {"skip": reason}) if reason else (manifest, None)


# numpy parses every .npy header with ast.literal_eval, and CPython 3.11's AST constructor keeps its
# recursion depth per interpreter, not per thread ("SystemError: AST constructor recursion depth
# mismatch" when two threads parse at once). Ranks that share a process (SimulatedCluster) therefore
# read their shards one at a time; with one rank per process the lock is never contended.
_SHARD_READ = threading.Lock()


@contextlib.contextmanager
def _open_shard(path):
    with _SHARD_READ, np.load(path) as shard:
        yield shard


def restore(directory, manifest, model, optimizer, comm):
    """Loads this rank's state from the checkpoint in ``directory``.

    At the number of ranks that saved it, each rank loads its own shard. At
    another number (the strategy's ``resize_refusal`` says where that is
    allowed; the trainer checks it first), or in other process groups than the
    manifest names (Hierarchical at another ``ranks_per_group``), every rank
    reads the p saved shards and takes its state by the strategy's rules
    (``load_resized``).
    """
    groups = state_groups(model, optimizer)
    if manifest["num_ranks"] == comm.size and not _regrouped(manifest, optimizer):
        path = os.path.join(directory, f"rank-{comm.rank:05d}.npz")
        with _open_shard(path) as shard:
            _check_fits(path, shard.files, groups)
            _assign(path, groups, shard)
        _strategy_state_restored(optimizer)
        return
    paths = [os.path.join(directory, f"rank-{r:05d}.npz") for r in range(manifest["num_ranks"])]
    states = []
    for path in paths:
        with _open_shard(path) as shard:
            # The strategy's entries are checked once read in this run's layout (load_resized).
            _check_fits(path, [k for k in shard.files if not k.startswith("strategy/")],
                        {name: v for name, v in groups.items() if name != "strategy"})
            states.append({key: shard[key] for key in shard.files})
    load_resized(states, model, optimizer, comm.size, comm.rank, source=directory)


def _process_groups(optimizer):
    strategy = getattr(optimizer, "strategy", None)
    groups = strategy.process_groups() if strategy is not None else None
    return None if groups is None else [[int(r) for r in group] for group in groups]


def _regrouped(manifest, optimizer):
    """True when the strategy's groups of ranks are not those the checkpoint was
    saved with (its manifest's ``process_groups``): its state is then mapped as
    at another number of ranks. A manifest without them (older) is taken to
    have the same groups (a Hierarchical shard layout that differs is refused
    when restored)."""
    saved = manifest.get("process_groups")
    return saved is not None and saved != _process_groups(optimizer)


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
    states = _in_this_layout(states, optimizer)
    for state in states:
        _check_fits(source, state, groups)
    _assign(source, groups, resize.resized_state(states, resize_rules(model, optimizer), ranks, rank))
    _strategy_state_restored(optimizer)
    _restart_weights(model, optimizer)


def _in_this_layout(states, optimizer):
    """``states`` with the strategy's entries as this run's layout holds them
    (``SyncStrategy.saved_state_in_layout``: a Hierarchical run's shards of
    another group size, or per weight where this run keeps shards)."""
    strategy = getattr(optimizer, "strategy", None)
    if strategy is None:
        return states
    keys = sorted(k for k in states[0] if k.startswith("strategy/"))
    try:
        lists = strategy.saved_state_in_layout([[state[k] for k in keys] for state in states])
    except ValueError as err:
        raise CheckpointError(f"the saved strategy state does not fit this run's layout: {err}") from None
    return [{**{k: v for k, v in state.items() if not k.startswith("strategy/")},
             **{f"strategy/{i:05d}": v for i, v in enumerate(entries)}} for state, entries in zip(states, lists)]


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
