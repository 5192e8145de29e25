"""The language model end to end: train.py's transformer on real text (a slice of the Python docs that
make setup installs), one small run on each collective path, and its exact resume.

The floor each run must beat is the held-out text's cross-entropy under the training text's byte
frequencies (a unigram model, 3.40 nats on this slice): below 0.85 of it (2.89), the model has learned
from context, not just which bytes are common. A run whose sparse embedding gradient were dropped or
mis-averaged on some path stays above it, or its ranks disagree. After two epochs SyncAverage reaches
about 2.1 and DiLoCo τ=4 (int8) about 2.7: DiLoCo's outer step lags early in a run this short.

The Gloo run and its resume share one launch (issue 41 §4): scripts/train_runs.py calls train.py's main()
for the one, then the other, on every rank, so the ranks import TensorFlow once for both.
"""
import json
import math
import os
import re

import numpy as np
import pytest

from hvd_easgd import DiLoCo
from hvd_easgd.app import cli, data, trainer
from hvd_easgd.app.transformer import parameter_count
from tests.helpers import ROOT, launch
from tests.multiproc.helpers import assert_same_state, assert_train_run_ended_well, shard_arrays, train_runs

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
CORPUS_BYTES = 150_000
CONTEXT = 32
BATCH = 16
SMALL = ["--context", str(CONTEXT), "--layers", "1", "--width", "32", "--heads", "2", "--batch-size", str(BATCH),
         "--lr", "0.003", "--threads-per-rank", "1"]
FLOOR_SHARE = 0.85
FINAL = re.compile(r"final validation loss: (\d+\.\d{4}) nats/token, perplexity (\d+\.\d{3})")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 150 kB of the Python docs' byte stream, as a user's text file, and its unigram floor."""
    if not os.path.isdir(data.PYTHON_DOCS_DIR):
        pytest.fail(f"{data.PYTHON_DOCS_DIR} is missing: make setup installs Debian's python3.11-doc")
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    np.asarray(data.python_docs().x_train.tokens[:CORPUS_BYTES]).tofile(path)
    text = data.text_file(str(path), CONTEXT)
    counts = np.bincount(text.x_train[np.arange(len(text.x_train))].ravel(), minlength=256) + 1  # add-one
    targets = text.y_test[np.arange(len(text.y_test))].ravel()
    unigram = float(-np.log(counts[targets] / counts.sum()).mean())
    return str(path), unigram


# One run per collective path, each with another strategy, so that each path carries the
# embedding's densified gradient (or what the strategy sends instead) at p = 2. The Gloo run
# also keeps a checkpoint every 10 micro-batches: the resume test starts from one of them.
PATHS = {
    "horovod-gloo": ("gloo", ["--collectives", "horovod", "--strategy", "diloco", "--tau", "4",
                              "--checkpoint-every-steps", "10", "--keep-checkpoints", "100"]),
    "horovod-mpi": ("mpi", ["--collectives", "horovod", "--strategy", "sync"]),
    "mpi-direct": ("mpirun", ["--collectives", "mpi-direct", "--strategy", "easgd", "--tau", "4"]),
}


RUN_SECONDS = 180  # each run's bound, as each had its own launch's


def gloo_warmup(steps):
    """The Gloo run's SyncAverage steps before DiLoCo's periods: train.py's default, the cosine schedule's
    warm-up of its 2 epochs' updates (it holds fewer than 10 periods of 4), resolved as the trainer does."""
    config = trainer._resolve_warmup(cli.parse_args(["--data", "text:/etc/hostname", "--epochs", "2"]), steps)
    warmup = DiLoCo.default_warmup_steps({"tau": 4}, config.lr_warmup_updates)
    assert warmup > 0, steps
    return warmup


def resume_start(corpus_path):
    """The Gloo run's resume point: its first step checkpoint of the second epoch past its tenth micro-batch
    and off DiLoCo's period of 4 (the ranks' inner weights differ there, and the outer step is pending).
    Step checkpoints fall every 10 global micro-batches; the epochs hold ``steps`` (train.py's count)."""
    steps = data.steps_per_epoch(len(data.text_file(corpus_path, CONTEXT).y_train), BATCH, 2)
    mid = [step for step in range(11, steps) if (steps + step) % 10 == 0 and (steps + step - gloo_warmup(steps)) % 4]
    assert mid, steps
    return steps, f"epoch-000001-step-{mid[0]:06d}"


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Each path's run, launched once and shared by the tests that read it: ``runs(path)`` is
    ``(run directory, what its ranks printed)``. The Gloo path's launch also resumes, in the same processes,
    that run stopped at resume_start() (its checkpoints up to there copied): ``runs("resumed")``."""
    done = {}

    def launch_gloo():
        launcher, options = PATHS["horovod-gloo"]
        out = str(tmp_path_factory.mktemp("horovod-gloo"))
        straight, broken = os.path.join(out, "straight", "run"), os.path.join(out, "resumed", "run")
        argv = ["--data", f"text:{corpus[0]}", *SMALL, *options, "--epochs", "2", "--run-dir", straight]
        proc = train_runs(out, [{"name": "straight", "argv": argv},
                                {"name": "resumed", "argv": ["--resume", broken],
                                 "stopped_at": [straight, resume_start(corpus[0])[1], broken]}],
                          launcher, step_seconds=RUN_SECONDS)
        for name, run_dir in (("straight", straight), ("resumed", broken)):
            done[name] = run_dir, assert_train_run_ended_well(out, name, proc, 2).stdout
        done["horovod-gloo"] = done.pop("straight")

    def get(path):
        if path not in done:
            if path in ("horovod-gloo", "resumed"):
                launch_gloo()
            else:
                launcher, options = PATHS[path]
                run_dir = str(tmp_path_factory.mktemp(path) / "run")
                proc = launch([TRAIN, "--data", f"text:{corpus[0]}", *SMALL, *options, "--epochs", "2",
                               "--run-dir", run_dir], launcher, timeout=RUN_SECONDS)
                assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
                done[path] = run_dir, proc.stdout
        return done[path]

    return get


@pytest.mark.timeout(2 * RUN_SECONDS + 120)  # the Gloo path's launch runs its resume too
@pytest.mark.parametrize("path", list(PATHS))
def test_a_small_language_model_learns_on_every_collective_path(path, corpus, runs):
    _, unigram = corpus
    run_dir, stdout = runs(path)
    finals = FINAL.findall(stdout)
    assert len(finals) == 1, stdout[-2000:]  # rank 0 alone reports
    loss, shown_perplexity = map(float, finals[0])
    assert loss < FLOOR_SHARE * unigram, (loss, unigram)
    assert shown_perplexity == pytest.approx(math.exp(loss), abs=2e-3)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    rows, final = metrics["epochs"], metrics["final"]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert rows[1]["test_loss"] < rows[0]["test_loss"]
    for row in rows:
        assert row["test_perplexity"] == pytest.approx(math.exp(row["test_loss"]), rel=1e-12)
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"]), rel=1e-12)
        assert row["tokens_per_sec"] == pytest.approx(row["samples_per_sec"] * CONTEXT, rel=1e-12)
        assert len(row["rss_mb"]) == 2 and all(mb > 100 for mb in row["rss_mb"])
    assert final["test_perplexity"] == pytest.approx(math.exp(final["test_loss"]), rel=1e-12)
    if "sync" in PATHS[path][1]:  # the embedding travels densified: every parameter, 4 bytes, every step
        params = parameter_count(CONTEXT, 256, layers_count=1, width=32)
        assert rows[1]["bytes_sent_per_step"] == 4 * params


@pytest.mark.timeout(2 * RUN_SECONDS + 120)  # may set up the Gloo path's launch
def test_the_language_model_resumes_bit_identically_mid_epoch(corpus, runs):
    """DiLoCo (an outer optimizer's state) over Adam (its moments) on the cosine schedule (a
    function of the update count): the Gloo run stopped mid-epoch, off the τ phase, and resumed
    ends with the uninterrupted run's state, bit for bit."""
    straight, _ = runs("horovod-gloo")
    steps, start = resume_start(corpus[0])
    assert json.load(open(os.path.join(straight, "checkpoints", "epoch-000001", "manifest.json")))[
        "steps_per_epoch"] == steps
    assert start in os.listdir(os.path.join(straight, "checkpoints"))
    broken, _ = runs("resumed")  # stopped at start: that checkpoint and the ones before it, then --resume
    expected = assert_same_state(straight, broken, "epoch-000002")
    # the token table (256 x 32: sparse gradients) was among the arrays compared
    assert any(v.shape == (256, 32) for k, v in expected.items() if k.startswith("0:model/"))


def _last_checkpoint(run_dir):
    """The run's last checkpoint's arrays (``shard_arrays``: ``"rank:array"``), and model.keras's weights."""
    import keras

    arrays = shard_arrays(run_dir, "epoch-000002")
    kept = [np.asarray(w) for w in keras.models.load_model(os.path.join(run_dir, "model.keras")).get_weights()]
    return arrays, kept


@pytest.mark.timeout(3 * RUN_SECONDS + 120)  # may set up the Gloo path's launch (and its resume) and mpi-direct's
def test_the_kept_model_holds_the_last_partial_period(corpus, runs):
    """The end-of-training merge under a launcher, after a step count that is not a multiple of τ = 4:
    model.keras is what NumPy computes from the last checkpoint (written before the merge, so a resume
    is unchanged). DiLoCo (Gloo): one more Nesterov outer step, m' = μm − ηΔ, θ' = θ + μm' − ηΔ with
    Δ the ranks' mean of θ − x_i; EASGD (the direct MPI ops): the center on the workers' mean."""
    steps = data.steps_per_epoch(len(data.text_file(corpus[0], CONTEXT).y_train), BATCH, 2)
    assert (2 * steps - gloo_warmup(steps)) % 4 and (2 * steps) % 4, steps  # the runs end inside a period
    arrays, kept = _last_checkpoint(runs("horovod-gloo")[0])
    count = len(kept)
    locals_ = [[arrays[f"{rank}:model/{i:05d}"] for i in range(count)] for rank in (0, 1)]
    assert [x.shape for x in locals_[0]] == [w.shape for w in kept]
    state = [arrays[f"0:strategy/{i:05d}"] for i in range(len([k for k in arrays if k.startswith("0:strategy/")]))]
    # DiLoCo's state: step and skip counters, then θ, then its outer SGD's iteration, rate and momenta
    theta, momenta = state[2:2 + count], state[2 + count + 2:2 + 2 * count + 2]
    assert [t.shape for t in theta] == [m.shape for m in momenta] == [w.shape for w in kept]
    assert any(not np.array_equal(x, t) for x, t in zip(locals_[0], theta))  # the ranks had moved past θ
    for i, (t, m) in enumerate(zip(theta, momenta)):
        delta = (t - locals_[0][i] + t - locals_[1][i]) / 2
        moved = 0.7 * m - 0.7 * delta
        np.testing.assert_allclose(kept[i], t + 0.7 * moved - 0.7 * delta, rtol=1e-5, atol=1e-6)
    arrays, kept = _last_checkpoint(runs("mpi-direct")[0])
    for i, w in enumerate(kept):
        np.testing.assert_allclose(w, (arrays[f"0:model/{i:05d}"] + arrays[f"1:model/{i:05d}"]) / 2,
                                   rtol=1e-5, atol=1e-6)
