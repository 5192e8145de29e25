"""Verified checkpoints: sizes and SHA-256 in the manifest, verification before loading, fallback to
the newest intact checkpoint, rotation that counts only intact ones, and a failed save (a full disk)
that every rank learns of and that leaves the previous checkpoint whole. In-process: one rank, or
SimulatedCluster's ranks on threads."""
import errno
import hashlib
import json
import os

import keras
import numpy as np
import pytest

import hvd_easgd
from hvd_easgd import LocalCommunicator, SyncAverage, callbacks, checkpoint
from hvd_easgd.checkpoint import verification
from hvd_easgd.comm.simulated_comm import SimulatedCluster
from hvd_easgd.checkpoint.preemption import TrainingPreempted

pytestmark = pytest.mark.unit


def model_and_optimizer(comm):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), SyncAverage(), comm=comm)
    return model, opt


def saved_run(run_dir, epochs, keep=0):
    model, opt = model_and_optimizer(LocalCommunicator())
    for epoch in epochs:
        checkpoint.save(run_dir, epoch, model, opt, opt.comm, {}, keep=keep)
    return model, opt


def names(run_dir):
    return sorted(os.listdir(os.path.join(run_dir, "checkpoints")))


def shard(run_dir, epoch, rank=0):
    return os.path.join(checkpoint.checkpoint_dir(run_dir, epoch), f"rank-{rank:05d}.npz")


def truncate(path):
    os.truncate(path, os.path.getsize(path) - 1)


def alter(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 1]))


def test_the_manifest_records_each_shards_size_and_sha256(tmp_path):
    run_dir = str(tmp_path)
    saved_run(run_dir, [1])
    with open(shard(run_dir, 1), "rb") as f:
        data = f.read()
    manifest = json.load(open(os.path.join(checkpoint.checkpoint_dir(run_dir, 1), "manifest.json")))
    assert manifest["format"] == checkpoint.FORMAT_VERSION == 2  # the shards mean what they meant
    assert manifest["checksums"] == {"rank-00000.npz": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


DAMAGES = {
    "short": (lambda d: truncate(os.path.join(d, "rank-00000.npz")), "rank-00000.npz holds {short} bytes, the "
                                                                     "manifest says {size}"),
    "altered": (lambda d: alter(os.path.join(d, "rank-00000.npz")),
                "rank-00000.npz: SHA-256 differs from the manifest's (altered since it was written)"),
    "missing": (lambda d: os.remove(os.path.join(d, "rank-00000.npz")), "rank-00000.npz is missing"),
    "unparsable": (lambda d: open(os.path.join(d, "manifest.json"), "w").write("{\"epoch\": "),
                   "manifest.json does not parse (Expecting value: line 1 column 11 (char 10))"),
    "interrupted": (lambda d: os.remove(os.path.join(d, "manifest.json")),
                    "an interrupted save (no manifest.json), skipped by design"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_checkpoint_is_skipped_in_one_line_for_the_newest_intact_one(damage, tmp_path):
    run_dir = str(tmp_path)
    saved_run(run_dir, [1, 2, 3])
    size = os.path.getsize(shard(run_dir, 3))
    spoil, reason = DAMAGES[damage]
    spoil(checkpoint.checkpoint_dir(run_dir, 3))
    lines = []
    manifest, directory = checkpoint.latest(run_dir, report=lines.append)
    assert (manifest["epoch"], os.path.basename(directory)) == (2, "epoch-000002")
    assert lines == ["skipping checkpoint epoch-000003: " + reason.format(short=size - 1, size=size)]


def test_no_intact_checkpoint_is_refused_naming_each_reason(tmp_path):
    run_dir = str(tmp_path)
    saved_run(run_dir, [1, 2])
    size = os.path.getsize(shard(run_dir, 1))
    truncate(shard(run_dir, 1))
    os.remove(shard(run_dir, 2))
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.latest(run_dir)
    assert str(raised.value) == (f"--resume {run_dir}: no intact checkpoint under {run_dir}/checkpoints "
                                 f"(epoch-000002: rank-00000.npz is missing; epoch-000001: rank-00000.npz holds "
                                 f"{size - 1} bytes, the manifest says {size})")


def test_a_checkpoint_from_before_checksums_is_read_with_a_notice_and_checked_by_its_crcs(tmp_path):
    # A user upgrading mid-run: format 2, no "checksums"; numpy's zip CRC-32s still catch damage.
    run_dir = str(tmp_path)
    saved_run(run_dir, [1, 2])
    for epoch in (1, 2):
        path = os.path.join(checkpoint.checkpoint_dir(run_dir, epoch), "manifest.json")
        manifest = json.load(open(path))
        del manifest["checksums"]
        json.dump(manifest, open(path, "w"))
    alter(shard(run_dir, 2))
    lines = []
    manifest, _ = checkpoint.latest(run_dir, report=lines.append)
    assert manifest["epoch"] == 1
    assert lines[0].startswith("skipping checkpoint epoch-000002: rank-00000.npz ")  # its CRC or its zip structure
    assert lines[1:] == ["checkpoint epoch-000001 has no checksums (written before hvd_easgd recorded them): its "
                         "shards were checked by their zip CRC-32s"]


def test_the_ranks_agree_to_skip_what_any_of_them_finds_damaged(tmp_path):
    # Only rank 1's shard of the newest checkpoint is short: rank 0's is intact, and still
    # rank 0 must not load it while rank 1 falls back.
    run_dir = str(tmp_path)
    cluster = SimulatedCluster(2)
    pairs = [model_and_optimizer(comm) for comm in cluster.communicators]
    cluster.run(lambda rank: [checkpoint.save(run_dir, e, *pairs[rank], pairs[rank][1].comm, {}) for e in (1, 2)])
    truncate(shard(run_dir, 2, rank=1))
    got, lines = [None, None], [[], []]

    def resume(rank):
        got[rank] = checkpoint.latest(run_dir, cluster.communicators[rank], report=lines[rank].append)

    cluster.run(resume)
    assert [g[0]["epoch"] for g in got] == [1, 1]
    size = os.path.getsize(shard(run_dir, 2, rank=1))
    expected = [f"skipping checkpoint epoch-000002: rank-00001.npz holds {size} bytes, the manifest says {size + 1}"]
    assert lines == [expected, expected]


def test_each_rank_verifies_only_the_shards_it_reads():
    manifest = {"num_ranks": 2, "shards": ["rank-00000.npz", "rank-00001.npz"]}
    assert verification.shards_read_by(manifest, 1, 2) == ["rank-00001.npz"]
    assert verification.shards_read_by(manifest, 0, 3) == ["rank-00000.npz", "rank-00001.npz"]  # a resize reads all


@pytest.mark.parametrize("verdicts, keep, deleted", [
    ([("a", None), ("b", None), ("c", None)], 2, ["a"]),
    ([("a", None), ("b", None), ("c", "short")], 2, []),  # the damaged newest does not count
    ([("a", None), ("b", "short"), ("c", None), ("d", None)], 2, ["a", "b"]),
    ([("a", "short"), ("b", None), ("c", "short")], 1, ["a"]),  # damaged and newer than the kept one: stays
    ([("a", None), ("b", None)], 0, []),  # 0: keep all
])
def test_rotation_counts_only_intact_checkpoints(verdicts, keep, deleted):
    assert verification.outdated(verdicts, keep) == deleted


def test_keep_checkpoints_never_deletes_the_last_intact_one(tmp_path):
    run_dir = str(tmp_path)
    model, opt = saved_run(run_dir, [1, 2], keep=2)
    alter(shard(run_dir, 2))  # bit rot after the save
    checkpoint.save(run_dir, 3, model, opt, opt.comm, {}, keep=2)
    # counting manifests, epoch 1 would go and leave one intact checkpoint of the two asked for
    assert names(run_dir) == ["epoch-000001", "epoch-000002", "epoch-000003"]
    checkpoint.save(run_dir, 4, model, opt, opt.comm, {}, keep=2)
    assert names(run_dir) == ["epoch-000003", "epoch-000004"]  # 3 and 4 intact: older ones go, damaged or not
    open(os.path.join(checkpoint.checkpoint_dir(run_dir, 4), "manifest.json"), "w").write("{")
    checkpoint.save(run_dir, 5, model, opt, opt.comm, {}, keep=2)
    assert names(run_dir) == ["epoch-000003", "epoch-000004", "epoch-000005"]  # 4 is newer than intact 3: stays


def test_rotation_asks_each_rank_about_its_own_shards(tmp_path):
    # rank 1's shard of epoch 2 rots: rank 0 cannot tell from its own, rank 1 verifies it
    run_dir = str(tmp_path)
    cluster = SimulatedCluster(2)
    pairs = [model_and_optimizer(comm) for comm in cluster.communicators]

    def save(epochs, keep):
        cluster.run(lambda rank: [checkpoint.save(run_dir, e, *pairs[rank], pairs[rank][1].comm, {}, keep=keep)
                                  for e in epochs])

    save([1, 2], keep=0)
    alter(shard(run_dir, 2, rank=1))
    save([3], keep=2)
    assert names(run_dir) == ["epoch-000001", "epoch-000002", "epoch-000003"]  # 1 and 3 are the intact two


def failing_open(failing_rank, real=open):
    """``open`` as a full disk makes it for rank ``failing_rank``'s shard."""
    def full(path, mode="r", *args, **kwargs):
        if f"rank-{failing_rank:05d}" in os.path.basename(path) and "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(path, mode, *args, **kwargs)
    return full


def test_a_save_that_fails_on_one_rank_fails_on_every_rank_and_leaves_the_previous_one(tmp_path, monkeypatch):
    run_dir = str(tmp_path)
    cluster = SimulatedCluster(2)
    pairs = [model_and_optimizer(comm) for comm in cluster.communicators]
    cluster.run(lambda rank: checkpoint.save(run_dir, 1, *pairs[rank], pairs[rank][1].comm, {}))
    monkeypatch.setattr("builtins.open", failing_open(1))
    raised = [None, None]

    def save(rank):
        try:
            checkpoint.save(run_dir, 2, *pairs[rank], pairs[rank][1].comm, {}, keep=1)
        except checkpoint.CheckpointSaveError as err:
            raised[rank] = str(err)

    cluster.run(save)
    assert raised == ["checkpoint epoch-000002 not saved: rank 1: [Errno 28] No space left on device"] * 2
    assert names(run_dir) == ["epoch-000001"]  # no shard of the failed save is left, and rotation did not run
    manifest, _ = checkpoint.latest(run_dir)
    assert manifest["epoch"] == 1


def test_a_manifest_that_cannot_be_written_fails_the_save_on_every_rank(tmp_path, monkeypatch):
    run_dir = str(tmp_path)
    model, opt = saved_run(run_dir, [1])
    real = checkpoint.store.atomic.write_json

    def full(path, payload, **options):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(checkpoint.store.atomic, "write_json", full)
    with pytest.raises(checkpoint.CheckpointSaveError,
                       match=r"^checkpoint epoch-000002 not saved: rank 0: manifest.json: \[Errno 30\] Read-only "
                             r"file system$"):
        checkpoint.save(run_dir, 2, model, opt, opt.comm, {})
    monkeypatch.setattr(checkpoint.store.atomic, "write_json", real)
    assert names(run_dir) == ["epoch-000001"]


def test_the_callback_says_why_in_one_line_and_the_next_save_tries_again(tmp_path, monkeypatch, capsys):
    run_dir = str(tmp_path)
    model, opt = saved_run(run_dir, [1])
    model.optimizer = opt
    callback = callbacks.PeriodicCheckpoint(run_dir, opt.comm, {}, every=1, keep=3)
    callback.set_model(model)
    monkeypatch.setattr("builtins.open", failing_open(0))
    callback.on_epoch_end(1)  # epoch 2 done: its save fails
    monkeypatch.undo()
    assert capsys.readouterr().err == (
        "hvd_easgd: checkpoint epoch-000002 not saved: rank 0: [Errno 28] No space left on device; epoch-000001 "
        "stays the newest; training goes on and the next checkpoint tries again\n")
    assert callback.failed_saves == ["epoch-000002"] and callback.stopped_at is None
    callback.on_epoch_end(2)  # the next one succeeds
    assert names(run_dir) == ["epoch-000001", "epoch-000003"]
    assert checkpoint.latest(run_dir)[0]["epoch"] == 3


def test_a_stop_whose_checkpoint_failed_says_so():
    assert str(TrainingPreempted(2, 5, saved=False)) == (
        "stopped on a signal; the checkpoint at epoch 2, micro-batch 5 could not be saved, a resume continues "
        "from the newest intact one")
    assert str(TrainingPreempted(2, 5)) == "stopped on a signal after the checkpoint at epoch 2, micro-batch 5"


def test_the_options_a_resume_defaults_to_come_from_the_newest_manifest_that_parses(tmp_path):
    # train.py reads them before the ranks start, without reading a shard
    run_dir = str(tmp_path)
    model, opt = saved_run(run_dir, [1])
    checkpoint.save(run_dir, 2, model, opt, opt.comm, {"epochs": 9}, keep=0)
    checkpoint.save(run_dir, 3, model, opt, opt.comm, {"epochs": 10}, keep=0)
    open(os.path.join(checkpoint.checkpoint_dir(run_dir, 3), "manifest.json"), "w").write("[")
    os.remove(shard(run_dir, 2))  # shards are not its business: latest verifies them
    assert checkpoint.newest_manifest(run_dir)["config"] == {"epochs": 9}
    for epoch in (1, 2):
        os.remove(os.path.join(checkpoint.checkpoint_dir(run_dir, epoch), "manifest.json"))
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint under"):
        checkpoint.newest_manifest(run_dir)


def test_a_file_only_rank_0_writes_on_a_full_disk_ends_the_run_in_one_line(monkeypatch, capsys, tmp_path):
    from hvd_easgd.app import cli

    def full(config, dataset, strategy):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "runs/a/model.tmp-7.keras")

    monkeypatch.setattr(cli.data, "load", lambda *args, **kwargs: None)
    monkeypatch.setattr(cli, "train", full)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--run-dir", str(tmp_path / "a")])
    assert exited.value.code == 1
    assert capsys.readouterr().err == ("train.py: error (rank 0): cannot write runs/a/model.tmp-7.keras: [Errno 28] "
                                       "No space left on device; the newest intact checkpoint stays usable\n")
