"""The language model's data (text as a byte stream, its fixed held-out split and windows) and Fashion-MNIST."""
import gzip
import os
import zlib

import numpy as np
import pytest

from hvd_easgd.app import data

pytestmark = pytest.mark.unit

# 200 pieces of 50 or 51 bytes (10137 = 200 * 50 + 137): pieces of unequal length, and a period (251)
# that is no multiple of a piece. Windows of 10: a 50-byte piece holds 5 windows' inputs but only 4 with
# their targets, so a window that read one byte past its piece would show.
N, CONTEXT = 10137, 10
HELD = list(range(19, 200, 20))  # pieces 19, 39, ..., 199: every 20th


def _stream(n=N):
    return (np.arange(n) % 251).astype(np.uint8)


def _bounds(n=N):
    """The documented cut: piece i is tokens [i n // 200, (i + 1) n // 200)."""
    return [i * n // 200 for i in range(201)]


def _positions(windows):
    """Every token a window reads: its inputs and, one on, its last target."""
    return windows.starts[:, None] + np.arange(windows.context + 1)


# --- the held-out split ---------------------------------------------------------------------
def test_the_held_out_split_is_the_documented_pieces():
    d = data.text_windows(_stream(), CONTEXT, "t")
    bounds = _bounds()
    assert (bounds[19], bounds[20]) == (963, 1013)  # 10137 * 19 // 200, 10137 * 20 // 200: 50 bytes
    assert (bounds[39], bounds[40]) == (1976, 2027)  # 51 bytes
    # (50 - 1) // 10 = 4 windows from the piece's first byte, the last reading 993..1003; and 5 in the
    # 51 bytes of piece 39, the last reading up to the piece's last byte (2026)
    np.testing.assert_array_equal(d.x_test.starts[:9], [963, 973, 983, 993, 1976, 1986, 1996, 2006, 2016])
    # held out: pieces of 50, 51, 51, 50, 51, 51, 50, 51, 51, 51 bytes: 3 x 4 + 7 x 5 windows; each run
    # of 19 training pieces holds 963 bytes: (963 - 1) // 10 = 96 windows
    assert (len(d.x_test), len(d.x_train)) == (47, 960)

    piece = lambda pos: np.searchsorted(bounds, pos, side="right") - 1  # noqa: E731
    test_pieces = piece(_positions(d.x_test))
    assert (test_pieces == test_pieces[:, :1]).all()  # each test window inside one piece ...
    assert sorted(set(test_pieces[:, 0])) == HELD  # ... a held-out one, and every one holds some
    assert not set(piece(_positions(d.x_train)).ravel()) & set(HELD)  # training never reads held-out bytes

    # 5% held out, short of it by less than one window (and its target) per held-out piece
    held_bytes = sum(bounds[p + 1] - bounds[p] for p in HELD)
    assert abs(held_bytes - N / 20) <= len(HELD)  # pieces are within one byte of N / 200
    assert held_bytes - len(HELD) * (CONTEXT + 1) < len(d.x_test) * CONTEXT <= held_bytes


def test_the_split_is_a_function_of_the_stream_alone(tmp_path):
    a, b = data.text_windows(_stream(), CONTEXT, "a"), data.text_windows(_stream().copy(), CONTEXT, "b")
    np.testing.assert_array_equal(a.x_train.starts, b.x_train.starts)
    np.testing.assert_array_equal(a.x_test.starts, b.x_test.starts)
    # --seed moves nothing: load takes one and text ignores it
    path = tmp_path / "t.bin"
    _stream().tofile(path)
    seeded = [data.load(f"text:{path}", seed=s, context=CONTEXT) for s in (0, 7)]
    for d in seeded:
        np.testing.assert_array_equal(d.x_train.starts, a.x_train.starts)
        np.testing.assert_array_equal(d.x_test.starts, a.x_test.starts)


def test_an_epoch_reads_each_training_token_once():
    d = data.text_windows(_stream(), CONTEXT, "t")
    bounds = _bounds()
    inputs = (d.x_train.starts[:, None] + np.arange(CONTEXT)).ravel()
    assert len(np.unique(inputs)) == len(inputs)  # windows' inputs do not overlap
    covered = np.zeros(N, bool)
    covered[inputs] = True
    # the runs of training pieces: [0, 19), [20, 39), ..., [180, 199); each loses fewer than
    # context + 1 tokens at its end (its last token is a target only, so at least one)
    runs = [(bounds[p - 19], bounds[p]) for p in HELD]
    assert sum(end - begin for begin, end in runs) + sum(bounds[p + 1] - bounds[p] for p in HELD) == N
    assert covered.sum() == sum(covered[begin:end].sum() for begin, end in runs)  # nothing outside the runs
    for begin, end in runs:
        missed = end - begin - covered[begin:end].sum()
        assert 1 <= missed < CONTEXT + 1, (begin, end, missed)

    x, y = d.x_train[np.arange(len(d.x_train))], d.y_train[np.arange(len(d.y_train))]
    assert x.shape == y.shape == (960, CONTEXT)
    np.testing.assert_array_equal(x[:, 0], d.x_train.starts % 251)  # the window starts where it says
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])  # targets: the inputs one on
    np.testing.assert_array_equal(y[:, -1], (d.x_train.starts + CONTEXT) % 251)  # and the stream's next byte


# --- through the real pipelines ---------------------------------------------------------------
def _random_text():
    """4000 random bytes: windows of 10 are then unique, so a window names its position."""
    tokens = np.random.default_rng(0).integers(0, 256, 4000).astype(np.uint8)
    return data.text_windows(tokens, CONTEXT, "r")


def _epoch(d, seed, rank, size, epoch, batch=8):
    ds, steps = data.training_dataset(d, batch, seed, rank, size, epoch, epoch + 1)
    batches = [(x.numpy(), y.numpy()) for x, y in ds]
    assert len(batches) == steps
    return batches


def test_training_shards_are_disjoint_equal_and_reshuffled():
    d = _random_text()
    index_of = {row.tobytes(): i for i, row in enumerate(d.x_train[np.arange(len(d.x_train))].astype(np.int32))}
    assert len(index_of) == len(d.x_train) == 370  # unique windows: (19 * 20 - 1) // 10 = 37 a run

    def windows(batches):
        return [index_of[row.tobytes()] for x, _ in batches for row in x]

    ranks = [_epoch(d, seed=1, rank=r, size=2, epoch=0) for r in range(2)]
    x, y = ranks[0][0]
    assert (x.dtype, x.shape, y.dtype, y.shape) == (np.int32, (8, CONTEXT), np.int64, (8, CONTEXT))
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    shards = [windows(b) for b in ranks]
    assert len(shards[0]) == len(shards[1]) == 23 * 8  # 185 windows a rank // 8
    assert not set(shards[0]) & set(shards[1])
    assert len(set(shards[0]) | set(shards[1])) == 368  # the whole epoch but for 370 - 2 * 23 * 8 dropped
    assert windows(_epoch(d, seed=1, rank=0, size=2, epoch=0)) == shards[0]  # rebuilt: the same order
    assert windows(_epoch(d, seed=2, rank=0, size=2, epoch=0)) != shards[0]
    assert windows(_epoch(d, seed=1, rank=0, size=2, epoch=1)) != shards[0]


def test_test_windows_are_strided_over_the_ranks_and_cover_everything():
    d = _random_text()
    everything = d.x_test[np.arange(len(d.x_test))]
    assert len(everything) == 10  # 10 held-out pieces of 20 bytes, (20 - 1) // 10 = 1 window each
    seen = []
    for rank in range(3):
        batches = list(data.test_dataset(d, batch_size=7, rank=rank, size=3))
        x = np.concatenate([bx.numpy() for bx, _ in batches])
        y = np.concatenate([by.numpy() for _, by in batches])
        assert x.dtype == np.int32 and y.dtype == np.int64
        np.testing.assert_array_equal(x, everything[rank::3])
        np.testing.assert_array_equal(y, d.y_test[np.arange(rank, len(d.x_test), 3)])
        seen += [row.tobytes() for row in x.astype(np.uint8)]
    assert sorted(seen) == sorted(row.tobytes() for row in everything)


# --- text:PATH ---------------------------------------------------------------------------------
def test_a_text_file_stays_on_disk(tmp_path):
    path = tmp_path / "corpus.txt"
    _stream().tofile(path)
    d = data.load(f"text:{path}", context=CONTEXT)
    assert isinstance(d.x_train.tokens, np.memmap)  # mapped, not read into memory
    # held once: the four window sets read the same stream
    assert d.x_train.tokens is d.y_train.tokens is d.x_test.tokens is d.y_test.tokens
    assert d.name == f"text:{path}" and d.num_classes == 256 and d.tokens_per_sample == CONTEXT
    np.testing.assert_array_equal(d.x_test[[0]][0], np.arange(963, 973) % 251)


@pytest.mark.parametrize("make, message", [
    (None, "no such file"),
    (lambda p: p.mkdir(), "no such file"),  # a directory is no file
    (lambda p: p.write_bytes(b""), "0 bytes of text is too little"),
    # one window of 10 and its target in each of 200 pieces: 200 * 11 bytes
    (lambda p: p.write_bytes(b"x" * 100), "100 bytes of text is too little .* give at least 2200 bytes"),
])
def test_bad_text_gets_one_clear_error(tmp_path, make, message):
    path = tmp_path / "corpus.txt"
    if make:
        make(path)
    with pytest.raises(data.DataError, match=message) as err:
        data.load(f"text:{path}", context=CONTEXT)
    text = str(err.value)
    assert text.startswith(f"--data text:{path}: ") and "\n" not in text


def test_the_bytes_the_message_asks_for_are_enough(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"x" * 2200)
    d = data.load(f"text:{path}", context=CONTEXT)
    assert len(d.x_test) == 10  # every held-out piece (11 bytes) holds its one window


@pytest.mark.parametrize("spec", ["text:", "shakespeare", "fashion_mnist:"])
def test_a_spec_without_a_path_or_unknown_is_refused(spec):
    with pytest.raises(data.DataError, match=f"--data must be .* text:PATH. Received: '{spec}'"):
        data.load(spec)


# --- Fashion-MNIST ----------------------------------------------------------------------------
needs_fashion_mnist = pytest.mark.skipif(not os.path.isdir(data.FASHION_MNIST_DIR),
                                         reason=f"{data.FASHION_MNIST_DIR} is missing: install Debian's "
                                                "dataset-fashion-mnist (make setup does)")


@needs_fashion_mnist
def test_fashion_mnist_is_the_published_split():
    d = data.load("fashion_mnist")
    assert (d.x_train.shape, d.x_test.shape) == ((60_000, 28, 28, 1), (10_000, 28, 28, 1))
    assert d.x_train.dtype == np.uint8 and d.y_train.dtype == np.int64 and d.num_classes == 10
    np.testing.assert_array_equal(np.bincount(d.y_train), [6_000] * 10)
    np.testing.assert_array_equal(np.bincount(d.y_test), [1_000] * 10)
    assert d.scale == 1 / 255
    ds, _ = data.training_dataset(d, 64, seed=0, rank=0, size=1, start_epoch=0, epochs=1)
    x, _ = next(iter(ds))
    assert x.dtype == np.float32 and x.shape == (64, 28, 28, 1)
    index = data.epoch_indices(60_000, 0, 0, 0, 1, 1, 64)
    np.testing.assert_allclose(x.numpy(), d.x_train[index] / 255, rtol=1e-6)  # scaled, not raw bytes
    assert 0.0 <= x.numpy().min() and x.numpy().max() <= 1.0


def _idx(magic, shape, body):
    """An idx file: the magic number, each dimension (big-endian 32-bit), then the bytes of ``body``."""
    header = magic.to_bytes(4, "big") + b"".join(s.to_bytes(4, "big") for s in shape)
    return header + np.asarray(body, np.uint8).tobytes()


def _write_fashion(directory, gzipped):
    """Tiny idx files: 20 training and 10 test images of 28x28, labels 0..9 in turn."""
    directory.mkdir()
    rng = np.random.default_rng(0)
    parts = {}
    for part, n in (("train", 20), ("t10k", 10)):
        pixels = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        parts[part] = pixels
        files = {f"{part}-images-idx3-ubyte": _idx(0x803, (n, 28, 28), pixels),
                 f"{part}-labels-idx1-ubyte": _idx(0x801, (n,), np.arange(n) % 10)}
        for name, content in files.items():
            with (gzip.open if gzipped else open)(directory / (name + ".gz"), "wb") as f:
                f.write(content)
    return parts


@pytest.mark.parametrize("gzipped", [True, False])
def test_fashion_mnist_reads_idx_files_gzipped_or_not(tmp_path, gzipped):
    parts = _write_fashion(tmp_path / "f", gzipped)
    d = data.load(f"fashion_mnist:{tmp_path / 'f'}")
    np.testing.assert_array_equal(d.x_train[..., 0], parts["train"])
    np.testing.assert_array_equal(d.x_test[..., 0], parts["t10k"])
    np.testing.assert_array_equal(d.y_train, np.arange(20) % 10)
    assert d.x_train.shape == (20, 28, 28, 1) and d.scale == 1 / 255


def _corrupt(path):
    """The labels gzipped with the first byte of the deflate data (after gzip.compress's 10-byte
    header) flipped: zlib itself refuses it."""
    raw = bytearray(gzip.compress(_idx(0x801, (20,), np.arange(20) % 10)))
    raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(zlib.error):  # the case this exercises: neither gzip's EOFError nor an OSError
        gzip.decompress(bytes(raw))


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(0x801, (20, 28, 28), [0] * 15680))),
     "train-images-idx3-ubyte.gz is not an idx file of images"),
    (lambda p: (p / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(0x803, (10, 28, 28), [0] * 7000))),
     r"t10k-images-idx3-ubyte.gz is truncated or damaged: its header says \(10, 28, 28\), its body holds 7000 bytes"),
    (lambda p: (p / "train-labels-idx1-ubyte.gz").write_bytes((p / "train-labels-idx1-ubyte.gz").read_bytes()[:-12]),
     r"cannot read .*train-labels-idx1-ubyte.gz \(EOFError"),
    (lambda p: _corrupt(p / "train-labels-idx1-ubyte.gz"), r"cannot read .*train-labels-idx1-ubyte.gz \(error"),
    (lambda p: (p / "t10k-labels-idx1-ubyte.gz").unlink(), "no such file .*t10k-labels-idx1-ubyte.gz"),
    (lambda p: (p / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(0x801, (10,), [0] * 9 + [10]))),
     "the test labels must be 0-9; the largest is 10"),
])
def test_damaged_fashion_mnist_gets_one_clear_error(tmp_path, damage, message):
    directory = tmp_path / "f"
    _write_fashion(directory, gzipped=True)
    damage(directory)
    with pytest.raises(data.DataError, match=message) as err:
        data.load(f"fashion_mnist:{directory}")
    assert str(err.value).startswith(f"--data fashion_mnist:{directory}: ") and "\n" not in str(err.value)


# --- the Python documentation --------------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir(data.PYTHON_DOCS_DIR),
                    reason=f"{data.PYTHON_DOCS_DIR} is missing: install Debian's python3.11-doc (make setup does)")
def test_python_docs_is_megabytes_of_text_with_5_percent_held_out():
    d = data.load("python_docs", context=128)
    n = len(d.x_train.tokens)
    assert n >= 5_000_000 and d.name == "python_docs" and d.tokens_per_sample == 128
    # 5% held out, short of it by less than a window per held-out piece
    assert 0.05 - 10 * 129 / n - 10 / n < len(d.x_test) * 128 / n <= 0.05 + 10 / n


@pytest.mark.skipif(not os.path.isdir(data.PYTHON_DOCS_DIR),
                    reason=f"{data.PYTHON_DOCS_DIR} is missing: install Debian's python3.11-doc (make setup does)")
def test_the_language_model_page_states_the_corpus_as_it_loads():
    """docs/language-model.md's counts of the corpus are the loader's, not typed from memory."""
    page = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "language-model.md")).read()
    files = sum(name.endswith(".rst.txt") for _, _, names in os.walk(data.PYTHON_DOCS_DIR) for name in names)
    d = data.load("python_docs", context=128)
    size = len(d.x_train.tokens)
    held = len(d.x_test)
    assert f"{files} files, {size / 1e6:.1f} MB" in page
    assert f"{held:,} windows, {round(held * 128 / 1e3)} k tokens" in page


@pytest.mark.parametrize("fraction", [0.4, 0.3333])
def test_a_train_slice_is_spread_through_the_training_split_and_keeps_the_held_out_split(tmp_path, fraction):
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(range(256)) * 200)  # 51,200 bytes: 380 training windows of 128
    whole = data.text_file(str(path))
    sliced = data.train_slice(whole, fraction)
    total, kept = len(whole.y_train), len(sliced.y_train)
    assert kept == round(fraction * total)
    # sample floor(i N / n) of the N: evenly spread, the first and roughly the last kept
    expected = whole.x_train.starts[(np.arange(kept) * total) // kept]
    np.testing.assert_array_equal(sliced.x_train.starts, expected)
    np.testing.assert_array_equal(sliced.y_train[np.arange(kept)], whole.y_train[(np.arange(kept) * total) // kept])
    assert expected[-1] >= whole.x_train.starts[total - 1 - int(1 / fraction)]
    for part in ("x_test", "y_test"):  # the held-out windows, the same bytes
        np.testing.assert_array_equal(getattr(sliced, part)[np.arange(len(whole.y_test))],
                                      getattr(whole, part)[np.arange(len(whole.y_test))])
    assert data.train_slice(whole, 1.0) is whole


def test_a_train_slice_of_images_takes_their_labels_along():
    digits = data.digits()
    sliced = data.train_slice(digits, 0.5)
    index = (np.arange(len(sliced.y_train)) * len(digits.y_train)) // len(sliced.y_train)
    np.testing.assert_array_equal(sliced.x_train, digits.x_train[index])
    np.testing.assert_array_equal(sliced.y_train, digits.y_train[index])
    np.testing.assert_array_equal(sliced.x_test, digits.x_test)


def test_a_train_slice_that_keeps_nothing_is_refused():
    with pytest.raises(data.DataError, match=r"--train-fraction 0.0001 keeps none of the 1437 training samples of digits"):
        data.train_slice(data.digits(), 0.0001)
