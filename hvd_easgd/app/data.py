"""Training data: the embedded digits, Fashion-MNIST, synthetic images, a teacher's task, npz files, image
folders, and text for language models (the Python documentation, or any file of the user's).

Every rank loads the same global split and reads its own shard of it. The
split has its own fixed seed (``SPLIT_SEED``), so ``--seed`` never moves it.
Each epoch the training set is permuted with (seed, epoch) and rank r takes
positions r, r+p, r+2p, ... of that permutation, truncated so that every rank
runs the same number of steps (the remainder is dropped): nobody waits in a
collective that the others never reach. The test set is sharded the same way
without a permutation or a truncation (rank r evaluates samples r, r+p, ...):
evaluation has no collective per step, so shards may differ by one sample, and
``callbacks.GlobalEvaluationMetrics`` sums the metric state over ranks at the end.

Memory grows with the dataset, never with the number of epochs. A
``Dataset`` holds each array once, in its source's dtype (an npz file of uint8
images stays uint8); image folders are kept as file names. The pipelines
compute an epoch's permutation when they reach that epoch, gather one batch at
a time from the arrays, and cast it to float32 (or read and decode its image
file) only then.

Text is a byte stream (``TokenWindows``): a sample is a window of ``context``
bytes and its target the same window one byte on. The held-out split and the
windows are fixed functions of the stream's length (``text_windows``).
"""
import os
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf

from ..strategies import sample_shares

SPLIT_SEED = 20150222  # fixed: the split must not move with --seed
TEST_FRACTION = 0.2
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# What TF's decode_image reads for these suffixes: PNG and JPEG signatures.
IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


class DataError(ValueError):
    """The data the user pointed at cannot be used (one clear message)."""


class ImageFiles:
    """Encoded images (PNG or JPEG) of any size, kept as paths and decoded to
    float32 in [0, 1] with ``channels`` channels when a pipeline reads them.

    Indexing with an integer array gives the ``ImageFiles`` of those paths.
    """

    def __init__(self, paths, channels=3):
        self.paths = np.asarray(paths, dtype=str)
        self.channels = channels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        return ImageFiles(self.paths[index], self.channels)


@dataclass
class Dataset:
    """A train/test split, each array held once in its own dtype.

    Attributes:
        name: what it is (``digits``, ``synthetic``, ``npz``, ``images``).
        x_train, x_test: an array of shape (N, H, W, C) of any numeric dtype
            (the pipelines cast each batch to float32), or ``ImageFiles``
            (images of varying size, read and decoded per batch).
        y_train, y_test: int64 class labels of shape (N,), or for text the
            ``TokenWindows`` of the next tokens (shape (N, context)).
        num_classes: the number of classes; for text, the vocabulary (256 bytes).
        scale: what the pipelines multiply each batch by after the cast to
            float32 (1/255 for uint8 images kept as uint8); never applied to tokens.
    """
    name: str
    x_train: object
    y_train: object
    x_test: object
    y_test: object
    num_classes: int
    scale: float = 1.0

    @property
    def tokens_per_sample(self):
        """Tokens a sample holds (its context) for text, else None."""
        return self.x_train.shape[1] if isinstance(self.x_train, TokenWindows) else None

    @property
    def variable_size(self):
        """True for images of varying size (``ImageFiles``): they take batch size 1."""
        return isinstance(self.x_train, ImageFiles)

    @property
    def input_shape(self):
        if self.variable_size:
            return (None, None, self.x_train.channels)
        return tuple(self.x_train.shape[1:])


def _stratified_split(x, y):
    from sklearn.model_selection import train_test_split

    index = np.arange(len(y))
    try:
        train_idx, test_idx = train_test_split(index, test_size=TEST_FRACTION, random_state=SPLIT_SEED,
                                               stratify=y)
    except ValueError:  # a class too small to stratify: plain seeded split
        train_idx, test_idx = train_test_split(index, test_size=TEST_FRACTION, random_state=SPLIT_SEED)
    return x[train_idx], y[train_idx], x[test_idx], y[test_idx]


def digits():
    """scikit-learn's 1,797 handwritten 8×8 digits (shipped with the package, no download)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[..., None]
    y = bunch.target.astype(np.int64)
    return Dataset("digits", *_stratified_split(x, y), num_classes=10)


# The shape and classes of synthetic images when none are asked for (train.py's
# --image-shape and --num-classes defaults are these).
SYNTHETIC_IMAGE_SHAPE = (32, 32, 3)
SYNTHETIC_NUM_CLASSES = 10


def synthetic(image_shape=SYNTHETIC_IMAGE_SHAPE, num_classes=SYNTHETIC_NUM_CLASSES, train_size=2048, test_size=512,
              seed=0):
    """Random images with random labels: for throughput, not accuracy."""
    rng = np.random.default_rng(seed)
    make = lambda n: (rng.standard_normal((n, *image_shape), dtype=np.float32),  # noqa: E731
                      rng.integers(0, num_classes, n).astype(np.int64))
    x_train, y_train = make(train_size)
    x_test, y_test = make(test_size)
    return Dataset("synthetic", x_train, y_train, x_test, y_test, num_classes)


def npz(path):
    """``x``/``y`` arrays (and optionally ``x_test``/``y_test``) from an .npz file.

    ``x`` keeps the file's dtype (uint8 images stay uint8, a quarter of
    float32); the pipelines cast each batch to float32, values unchanged.
    """
    if not os.path.isfile(path):
        raise DataError(f"--data npz:{path}: no such file")
    try:
        arrays = np.load(path, allow_pickle=False)
        keys = set(arrays.files)
    except Exception as err:  # numpy raises several types for a bad file
        raise DataError(f"--data npz:{path}: not a readable .npz file ({err.__class__.__name__})") from None
    missing = {"x", "y"} - keys
    if missing:
        raise DataError(f"--data npz:{path}: missing array(s) {sorted(missing)}; found {sorted(keys)}")
    x, y = _check_xy(arrays["x"], arrays["y"], path, "x", "y")
    if "x_test" in keys and "y_test" in keys:
        x_test, y_test = _check_xy(arrays["x_test"], arrays["y_test"], path, "x_test", "y_test")
        x_train, y_train = x, y
    else:
        x_train, y_train, x_test, y_test = _stratified_split(x, y)
    num_classes = int(max(y.max(), y_test.max())) + 1
    return Dataset("npz", x_train, y_train, x_test, y_test, num_classes)


def _check_xy(x, y, path, xname, yname):
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise DataError(f"--data npz:{path}: `{xname}` must have shape (N, H, W[, C]); got {x.shape}")
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating) or x.dtype == bool):
        raise DataError(f"--data npz:{path}: `{xname}` must hold integers or floats; got dtype {x.dtype}")
    if y.ndim != 1 or len(y) != len(x):
        raise DataError(f"--data npz:{path}: `{yname}` must have shape ({len(x)},); got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise DataError(f"--data npz:{path}: `{yname}` must hold non-negative integer class labels")
    if len(x) == 0:
        raise DataError(f"--data npz:{path}: `{xname}` is empty")
    return x, y.astype(np.int64)


def image_folder(path):
    """A folder per class of PNG/JPEG images of any size, read from disk per batch.

    Only the file names are kept. Each file's signature (its first bytes) is
    checked here, so a file that is no PNG or JPEG gets one clear message at
    start-up; a file with a valid signature but a corrupt body fails with
    TensorFlow's decode error when the pipeline first reads it.
    """
    if not os.path.isdir(path):
        raise DataError(f"--data images:{path}: no such directory")
    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    if len(classes) < 2:
        raise DataError(f"--data images:{path}: expected one sub-folder per class (at least 2); found {classes}")
    paths, labels = [], []
    for label, cls in enumerate(classes):
        for fname in sorted(os.listdir(os.path.join(path, cls))):
            if not fname.lower().endswith(IMAGE_SUFFIXES):
                continue
            file = os.path.join(path, cls, fname)
            with open(file, "rb") as f:
                head = f.read(8)
            if not head.startswith(IMAGE_SIGNATURES):
                raise DataError(f"--data images:{path}: cannot decode {cls}/{fname}: not a PNG or JPEG file")
            paths.append(file)
            labels.append(label)
    if len(paths) < 5:
        raise DataError(f"--data images:{path}: found {len(paths)} images; need at least 5")
    x_train, y_train, x_test, y_test = _stratified_split(ImageFiles(paths), np.array(labels, dtype=np.int64))
    return Dataset("images", x_train, y_train, x_test, y_test, len(classes))


# --- Fashion-MNIST -----------------------------------------------------------------
# Debian's dataset-fashion-mnist (make setup installs it) ships the original idx files.
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {"x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
                       "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz"}
# The idx format's magic numbers: 0x0000 then the element type (0x08, unsigned byte) and the rank.
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 0x00000803, 0x00000801


def _read_idx(path, magic, spec):
    """An idx file (gzipped or not) as a uint8 array: (N, rows, cols) for images, (N,) for labels."""
    import gzip
    import zlib

    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as f:
            content = f.read()
    except FileNotFoundError:
        raise DataError(f"--data {spec}: no such file {path}") from None
    except (OSError, EOFError, zlib.error) as err:
        # a damaged gzip stream: BadGzipFile (an OSError) for a bad header or CRC, EOFError when
        # truncated, zlib.error when the compressed data itself is corrupt
        raise DataError(f"--data {spec}: cannot read {path} ({err.__class__.__name__}: {err})") from None
    rank = magic & 0xFF
    header = 4 + 4 * rank
    if len(content) < header or int.from_bytes(content[:4], "big") != magic:
        raise DataError(f"--data {spec}: {path} is not an idx file of {'images' if rank == 3 else 'labels'}")
    shape = tuple(int.from_bytes(content[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank))
    if len(content) - header != int(np.prod(shape)):
        raise DataError(f"--data {spec}: {path} is truncated or damaged: its header says {shape}, "
                        f"its body holds {len(content) - header} bytes")
    return np.frombuffer(content, np.uint8, offset=header).reshape(shape)


def fashion_mnist(directory=FASHION_MNIST_DIR):
    """Fashion-MNIST (Xiao et al. 2017): 60,000 training and 10,000 test images of 28×28 in 10 classes.

    The split is the published one (the t10k files are the test set). Images
    stay uint8; the pipelines scale each batch to [0, 1].
    """
    spec = "fashion_mnist" if directory == FASHION_MNIST_DIR else f"fashion_mnist:{directory}"
    if not os.path.isdir(directory):
        hint = (" (install Debian's dataset-fashion-mnist: make setup does)" if directory == FASHION_MNIST_DIR
                else "")
        raise DataError(f"--data {spec}: no such directory {directory}{hint}")
    arrays = {}
    for key, name in FASHION_MNIST_FILES.items():
        magic = IDX_IMAGES_MAGIC if key.startswith("x") else IDX_LABELS_MAGIC
        arrays[key] = _read_idx(os.path.join(directory, name), magic, spec)
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if len(x) != len(y):
            raise DataError(f"--data {spec}: the {part} images and labels do not match "
                            f"({len(x)} images, {len(y)} labels)")
        if len(y) and y.max() >= 10:
            raise DataError(f"--data {spec}: the {part} labels must be 0-9; the largest is {y.max()}")
    return Dataset("fashion_mnist", arrays["x_train"][..., None], arrays["y_train"].astype(np.int64),
                   arrays["x_test"][..., None], arrays["y_test"].astype(np.int64), num_classes=10, scale=1 / 255)


# --- text ----------------------------------------------------------------------------
# Tokens are bytes: a vocabulary of 256 that reads any file (UTF-8 in any language,
# code, or binary) with no tokenizer to download or fit, and no unknown token. A
# UTF-8 character outside ASCII costs 2-4 tokens; the Python docs are 99.9% ASCII.
VOCABULARY_SIZE = 256
DEFAULT_CONTEXT = 128
# The held-out split: the stream cut into HELD_OUT_PIECES equal pieces, of which every
# HELD_OUT_EVERY-th (pieces 19, 39, ...) is held out. 5% of the text, spread through
# it, so that no one part (a chapter, the last files) is the whole test set; fixed by
# the stream's length alone, the same on every rank and every run.
HELD_OUT_PIECES = 200
HELD_OUT_EVERY = 20
PYTHON_DOCS_DIR = "/usr/share/doc/python3.11/html/_sources"


class TokenWindows:
    """Windows of ``context`` tokens of a token stream, each starting at one of ``starts``,
    shifted by ``offset`` (0: the inputs; 1: their next tokens, the targets).

    The stream is held once (a ``np.memmap`` of a file stays on disk); indexing
    with an integer array gathers those windows into a (len(index), context)
    array of the stream's dtype.
    """

    def __init__(self, tokens, starts, context, offset=0):
        self.tokens, self.starts, self.context, self.offset = tokens, starts, context, offset

    def __len__(self):
        return len(self.starts)

    @property
    def shape(self):
        return (len(self.starts), self.context)

    @property
    def dtype(self):
        return self.tokens.dtype

    def __getitem__(self, index):
        first = self.starts[np.asarray(index)] + self.offset
        return self.tokens[first[..., None] + np.arange(self.context)]


def window_starts(begin, end, context):
    """Starts of the non-overlapping windows that fit in tokens [begin, end): a window
    reads ``context`` + 1 tokens (its inputs and, one on, its targets), so consecutive
    windows share one token, as the target of one and the first input of the next."""
    count = max(end - begin - 1, 0) // context
    return begin + context * np.arange(count, dtype=np.int64)


def text_windows(tokens, context, name):
    """The ``Dataset`` of a token stream: training windows over the pieces kept for
    training, test windows over the held-out pieces (``HELD_OUT_PIECES``).

    An epoch visits every training window once in a shuffled order, so it reads each
    training token once (but for fewer than ``context`` + 1 at the end of each of the
    10 runs of training pieces between the held-out ones, and what the equal shards drop).
    """
    bounds = len(tokens) * np.arange(HELD_OUT_PIECES + 1, dtype=np.int64) // HELD_OUT_PIECES
    held = np.arange(HELD_OUT_PIECES) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    train, test = [], []
    begin = 0
    for piece in np.flatnonzero(held):
        train.append(window_starts(begin, bounds[piece], context))
        test.append(window_starts(bounds[piece], bounds[piece + 1], context))
        begin = bounds[piece + 1]
    train.append(window_starts(begin, len(tokens), context))
    train, test = np.concatenate(train), np.concatenate(test)
    if len(test) < 1 or len(train) < 1:
        need = HELD_OUT_PIECES * (context + 1)  # a held-out piece must hold one window
        raise DataError(f"--data {name}: {len(tokens)} bytes of text is too little for windows of {context} "
                        f"tokens with a held-out split of 1/{HELD_OUT_EVERY}; give at least {need} bytes or a "
                        "smaller --context")
    return Dataset(name, TokenWindows(tokens, train, context), TokenWindows(tokens, train, context, offset=1),
                   TokenWindows(tokens, test, context), TokenWindows(tokens, test, context, offset=1),
                   num_classes=VOCABULARY_SIZE)


def text_file(path, context=DEFAULT_CONTEXT):
    """Any file of the user's as a byte stream (``--data text:PATH``), mapped from disk, not read into memory."""
    spec = f"text:{path}"
    if not os.path.isfile(path):
        raise DataError(f"--data {spec}: no such file")
    try:
        with open(path, "rb") as f:
            f.read(1)
        tokens = np.memmap(path, np.uint8, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
    except (OSError, ValueError) as err:
        raise DataError(f"--data {spec}: cannot read it ({err.__class__.__name__}: {err})") from None
    return text_windows(tokens, context, spec)


def python_docs(context=DEFAULT_CONTEXT, directory=PYTHON_DOCS_DIR):
    """The Python 3.11 documentation's reStructuredText sources (Debian's python3.11-doc, which
    make setup installs): 497 files, 11.0 MB of English technical prose and code,
    concatenated in sorted path order into one byte stream."""
    if not os.path.isdir(directory):
        raise DataError(f"--data python_docs: no such directory {directory} (install Debian's python3.11-doc: "
                        "make setup does)")
    paths = sorted(os.path.join(top, name) for top, _, names in os.walk(directory)
                   for name in names if name.endswith(".rst.txt"))
    if not paths:
        raise DataError(f"--data python_docs: {directory} holds no .rst.txt files")
    try:
        parts = [np.fromfile(p, np.uint8) for p in paths]
    except OSError as err:
        raise DataError(f"--data python_docs: cannot read {err.filename} ({err.strerror})") from None
    return text_windows(np.concatenate(parts), context, "python_docs")


# --- the teacher's task ------------------------------------------------------------
# A generated classification task whose labels a fixed random network (the
# teacher) assigns: no download, the same arrays from the same seed on every rank
# and every machine (NumPy's PCG64 and float64 arithmetic, cast to float32 at the
# end). The labels are a deterministic function of the inputs, so the ceiling is
# 100%. Two choices make it learnable steadily rather than to a plateau: the
# teacher is the student's own family (a ReLU MLP) at a much smaller width, and
# the samples nearer than a margin to the teacher's decision boundary are dropped
# (a 32 -> 64 tanh teacher without a margin left the student at 0.74-0.78). The
# set is small on purpose: an epoch at 2 ranks x 256 is 39 steps, so a run to the
# target spans many epochs and train.py's per-epoch evaluation times it finely.
# The teacher's seed is its own (TEACHER_SEED): --seed moves the student's
# weights and the data order, never the task.
TEACHER_SEED = 20260312
TEACHER_INPUT_DIM = 32
TEACHER_HIDDEN = 32
TEACHER_NUM_CLASSES = 10
TEACHER_MARGIN = 0.5  # of the pool's median gap between the two largest logits
TEACHER_TRAIN_SIZE = 20_000
TEACHER_TEST_SIZE = 5_000


def teacher(train_size=TEACHER_TRAIN_SIZE, test_size=TEACHER_TEST_SIZE, input_dim=TEACHER_INPUT_DIM,
            hidden=TEACHER_HIDDEN, num_classes=TEACHER_NUM_CLASSES, margin=TEACHER_MARGIN, seed=TEACHER_SEED):
    """Gaussian inputs labelled by a random two-layer ReLU network, every class equally often.

    The teacher is x -> argmax(relu(x W1) W2 + b) with W1 ~ N(0, 2/d) and
    W2 ~ N(0, 1/h). A random network's argmax favours some classes; the biases
    b are set so that each class takes about 1/k of a calibration sample (rounds
    of moving each class's bias by the log of its share). A sample is kept only
    if its two largest logits differ by at least ``margin`` times the pool's
    median difference, and the split takes exactly train_size/k and test_size/k
    kept samples of each class, in the pool's order. Inputs have shape
    (N, input_dim), float32. Vectorised: the default set takes well under a second.
    """
    for name, value in {"train_size": train_size, "test_size": test_size}.items():
        if value % num_classes:
            raise DataError(f"`{name}` must be a multiple of num_classes={num_classes}. Received: {name}={value}")
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((input_dim, hidden)) * np.sqrt(2 / input_dim)
    w2 = rng.standard_normal((hidden, num_classes)) / np.sqrt(hidden)
    features = lambda x: np.maximum(x @ w1, 0) @ w2  # noqa: E731
    calibration = features(rng.standard_normal((4_000, input_dim)))
    bias = np.zeros(num_classes)
    for _ in range(4 * num_classes):  # a class with share s moves by -log(s k): shares converge to 1/k
        share = np.bincount(np.argmax(calibration + bias, 1), minlength=num_classes) / len(calibration)
        bias -= 0.5 * np.log(np.maximum(share, 1e-3) * num_classes)
    per_class = (train_size + test_size) // num_classes
    pool = rng.standard_normal((4 * (train_size + test_size), input_dim))
    logits = features(pool) + bias
    top2 = np.sort(logits, 1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    labels = np.where(gap >= margin * np.median(gap), np.argmax(logits, 1), -1)  # -1: too near the boundary
    chosen = [np.flatnonzero(labels == c)[:per_class] for c in range(num_classes)]
    if min(len(c) for c in chosen) < per_class:  # cannot happen with the defaults; say so if it does
        raise DataError(f"the teacher's pool holds too few samples of some class for {per_class} per class")
    index = np.sort(np.concatenate(chosen))
    x, y = pool[index].astype(np.float32), labels[index].astype(np.int64)
    test = np.zeros(len(index), bool)
    for c in range(num_classes):  # the last test_size/k samples of each class (in pool order) are the test set
        test[np.flatnonzero(y == c)[-(test_size // num_classes):]] = True
    return Dataset("teacher", x[~test], y[~test], x[test], y[test], num_classes)


NAMED = ("digits", "fashion_mnist", "python_docs", "synthetic", "teacher")
SPEC_HELP = "digits | fashion_mnist[:DIR] | python_docs | synthetic | teacher | npz:PATH | images:DIR | text:PATH"


def train_slice(dataset, fraction):
    """``dataset`` with ``fraction`` of its training samples, spread evenly through the training
    split (sample ⌊i·N/n⌋ of N for i < n = round(fraction·N)), and its held-out split unchanged
    (``--train-fraction``: shorter epochs, judged on the same test set). Refuses a fraction that
    keeps no sample."""
    total = len(dataset.y_train)
    count = int(round(fraction * total))
    if count < 1:
        raise DataError(f"--train-fraction {fraction:g} keeps none of the {total} training samples of "
                        f"{dataset.name}; give at least {1 / total:.3g}")
    if count == total:
        return dataset
    index = np.arange(count, dtype=np.int64) * total // count
    return replace(dataset, x_train=_subset(dataset.x_train, index), y_train=_subset(dataset.y_train, index))


def _subset(samples, index):
    if isinstance(samples, TokenWindows):  # its indexing gathers windows; a subset keeps their starts
        return TokenWindows(samples.tokens, samples.starts[index], samples.context, samples.offset)
    return samples[index]


def is_text(spec):
    """Whether ``--data spec`` names text (a language model's data)."""
    return spec == "python_docs" or spec.startswith("text:")


def load(spec, image_shape=SYNTHETIC_IMAGE_SHAPE, num_classes=SYNTHETIC_NUM_CLASSES, seed=0, context=DEFAULT_CONTEXT):
    """The ``Dataset`` that ``--data spec`` names (``SPEC_HELP``); ``context``: tokens a text sample holds."""
    if spec == "digits":
        return digits()
    if spec == "teacher":
        return teacher()
    if spec == "synthetic":
        return synthetic(image_shape, num_classes, seed=seed)
    if spec == "fashion_mnist":
        return fashion_mnist()
    if spec == "python_docs":
        return python_docs(context)
    kind, _, path = spec.partition(":")
    if kind == "npz" and path:
        return npz(path)
    if kind == "images" and path:
        return image_folder(path)
    if kind == "text" and path:
        return text_file(path, context)
    if kind == "fashion_mnist" and path:
        return fashion_mnist(path)
    raise DataError(f"--data must be {SPEC_HELP.replace(' | ', ', ')}. Received: {spec!r}")


# --- sharding -------------------------------------------------------------------
def steps_per_epoch(num_train, batch_size, size):
    """Steps every rank takes per epoch: the smallest shard, in whole batches."""
    return (num_train // size) // batch_size


def epoch_indices(num_train, seed, epoch, rank, size, steps, batch_size, shares=None):
    """The training indices rank ``rank`` visits in ``epoch``, deterministic in (seed, epoch).

    With ``shares`` (rank r's micro-batch per step, ``sample_shares``; ``batch_size`` is this
    rank's), step s of all ranks together is positions [s·B, (s+1)·B) of the epoch's order
    (B = Σ shares) and rank r takes its share of them (``sample_shares.positions``). Equal
    shares are the layout without them: rank r takes positions r, r+p, r+2p, ...
    """
    order = np.random.default_rng([seed, epoch]).permutation(num_train)
    return rank_positions(order, rank, size, steps, batch_size, shares)


def rank_positions(order, rank, size, steps, batch_size, shares=None):
    """Rank ``rank``'s ``steps`` micro-batches of ``batch_size`` from ``order`` (a stretch of an epoch's
    permutation), flat: positions rank, rank+size, ...; with unequal ``shares``, its share of each
    global batch of Σ shares consecutive positions (``epoch_indices``)."""
    if shares is None or sample_shares.equal(shares):
        return order[rank::size][: steps * batch_size]
    block = sum(shares)
    mine = np.flatnonzero(sample_shares.positions(shares) == rank)
    return order[: steps * block].reshape(steps, block)[:, mine].ravel()


def rest_of_epoch(num_train, batch_size, size, samples_done, step_in_epoch, accumulate, steps):
    """Micro-batches each of ``size`` ranks runs to finish an epoch whose first
    ``samples_done`` positions are seen, and the step the rest starts at.

    Why this is the whole rule: rank r of p visits positions r, r+p, r+2p, ...
    of the epoch's permutation, which depends on (seed, epoch) alone, never on
    p (``epoch_indices``). After s micro-batches of b on every rank the ranks
    have seen positions 0 .. p·s·b − 1: a prefix of the epoch's order. At q
    ranks the rest of the epoch is that order from ``samples_done`` on, split
    the same way (rank r takes positions samples_done + r, + r + q, ...), so
    no sample of the epoch is seen twice or skipped but for the remainder
    every epoch drops (fewer than q·b samples, plus at most k − 1 micro-batches
    so that an open accumulation window closes at the epoch's end, and k more
    where the rest would fill a whole epoch at q).

    Args:
      num_train: N, the training samples.
      batch_size: b, samples per micro-batch.
      size: q, the ranks that continue.
      samples_done: D, the prefix of the epoch's order already seen.
      step_in_epoch: micro-batches the saving run had done in the epoch; its
        value mod ``accumulate`` is the open window's phase.
      accumulate: k, micro-batches per window.
      steps: micro-batches of a whole epoch at q ranks (a multiple of k).

    Returns:
      ``(rest, first_step)``: micro-batches left per rank (a multiple of k
      away from the window's phase, fewer than ``steps``), and ``steps − rest``,
      the step of an epoch at q the rest starts at (the checkpoint callback
      counts from there, so the epoch ends where epochs at q end). ``rest`` is
      0 when nothing is left.
    """
    rest = ((num_train - samples_done) // size) // batch_size
    rest -= (step_in_epoch + rest) % accumulate
    # Fewer than a whole epoch at q, so that the rest starts at a step > 0 of one.
    while rest >= steps:
        rest -= accumulate
    if rest < 0 or (rest == 0 and step_in_epoch % accumulate):
        raise DataError(f"the rest of the epoch ({num_train - samples_done} samples over {size} ranks) holds fewer "
                        f"than the {accumulate - step_in_epoch % accumulate} micro-batches of {batch_size} that "
                        "would close the open accumulation window; resume from an epoch-end checkpoint")
    return rest, steps - rest


def rest_of_epoch_dataset(data, batch_size, seed, rank, size, epoch, samples_done, rest, shares=None):
    """This rank's ``rest`` micro-batches of ``epoch`` after its first
    ``samples_done`` positions (``rest_of_epoch``): positions samples_done + rank,
    + rank + size, ... of the epoch's order (with ``shares``, its share of each
    global batch from there; ``batch_size`` is this rank's), as batches of
    (float32 images, int64 labels)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(data.y_train))
    index = rank_positions(order[samples_done:], rank, size, rest, batch_size, shares)
    index = index.astype(np.int64).reshape(rest, batch_size)
    batches = tf.data.Dataset.from_tensor_slices(index)
    return _read_batches(batches, data.x_train, data.y_train, _batches_per_gather(data.x_train, batch_size),
                         data.scale).prefetch(2)


def accumulation_windows(shard_sizes, k):
    """Windows of k micro-batches every rank must run so that all agree without
    communicating: enough for the largest shard. Windows do not span epochs."""
    return -(-max(shard_sizes) // k)


# --- pipelines ------------------------------------------------------------------
# Bytes of source data one NumPy gather reads at most. Each call into NumPy has
# a fixed cost: with one call per batch of 32 digits the pipeline took 60% more
# CPU per sample than the materialised pipeline did; gathering several small
# batches per call brings it back to within 15%, and large batches still go
# one at a time.
GATHER_BYTES = 1 << 20
MAX_BATCHES_PER_GATHER = 16


def _batches_per_gather(x, batch_size):
    if isinstance(x, ImageFiles):
        return 1
    batch_bytes = batch_size * int(np.prod(x.shape[1:])) * x.dtype.itemsize
    return int(np.clip(GATHER_BYTES // max(batch_bytes, 1), 1, MAX_BATCHES_PER_GATHER))


def _read_batches(index_batches, x, y, batches_per_gather=1, scale=1.0):
    """Maps a tf.data of index batches to (float32 images, int64 labels) batches,
    or for text to (int32 tokens, int64 next tokens).

    Arrays are gathered with NumPy, straight from ``x`` and ``y`` (handing them
    to TensorFlow whole would copy them), ``batches_per_gather`` batches per
    call, and cast to float32 (times ``scale``) after the gather. Image files
    are read and decoded, one per batch: images of different sizes cannot be stacked.
    """
    if isinstance(x, ImageFiles):
        paths, labels = tf.constant(x.paths), tf.constant(y, tf.int64)

        def read(index):
            image = tf.io.decode_image(tf.io.read_file(paths[index[0]]), channels=x.channels,
                                       expand_animations=False)
            return (tf.cast(image, tf.float32) / 255.0)[None], tf.gather(labels, index)

        return index_batches.map(read, num_parallel_calls=tf.data.AUTOTUNE)

    def gather(index):
        return x[index], y[index].astype(np.int64, copy=False)

    tokens = isinstance(x, TokenWindows)

    def read(index):
        rows, row_labels = tf.numpy_function(gather, [index], (tf.as_dtype(x.dtype), tf.int64), stateful=False)
        rows.set_shape(index.shape.concatenate(x.shape[1:]))
        row_labels.set_shape(index.shape.concatenate(y.shape[1:]))
        if tokens:  # token ids, for an Embedding
            return tf.cast(rows, tf.int32), row_labels
        rows = tf.cast(rows, tf.float32)
        return (rows * scale if scale != 1.0 else rows), row_labels

    if batches_per_gather == 1:
        return index_batches.map(read, num_parallel_calls=tf.data.AUTOTUNE)
    grouped = index_batches.batch(batches_per_gather).map(read, num_parallel_calls=tf.data.AUTOTUNE)
    return grouped.unbatch()


def training_dataset(data, batch_size, seed, rank, size, start_epoch, epochs, steps=None, start_step=0,
                     shares=None):
    """A tf.data pipeline over epochs [start_epoch, epochs) of this rank's shards,
    from micro-batch ``start_step`` of ``start_epoch`` on (a mid-epoch resume).

    Returns ``(dataset, steps)``: batches of (float32 images, int64 labels),
    ``steps`` per epoch. ``steps`` (default: ``steps_per_epoch``) is exactly
    what each epoch holds, so epoch e always starts at its own permutation
    (``epoch_indices``), also on resume. Each epoch's permutation is computed
    when the pipeline reaches it and each batch is gathered when it is read:
    memory does not grow with ``epochs``. ``ImageFiles`` take ``batch_size`` 1.
    A mid-epoch start skips index batches, never samples: nothing is read twice.
    With ``shares`` (every rank's micro-batch, ``sample_shares``), ``batch_size``
    is this rank's and each step's global batch is Σ shares (``epoch_indices``).
    """
    if data.variable_size and batch_size != 1:
        raise ValueError(f"images of different sizes need batch_size 1. Received: batch_size={batch_size}")
    num_train = len(data.y_train)
    if steps is None:
        steps = num_train // sum(shares) if shares else steps_per_epoch(num_train, batch_size, size)

    def epoch_batches(epoch):
        index = epoch_indices(num_train, seed, int(epoch), rank, size, steps, batch_size, shares)
        return index.astype(np.int64).reshape(steps, batch_size)

    def index_batches(epoch):
        batches = tf.numpy_function(epoch_batches, [epoch], tf.int64, stateful=False)
        batches.set_shape((steps, batch_size))
        return tf.data.Dataset.from_tensor_slices(batches)

    if not 0 <= start_step < steps:
        raise ValueError(f"`start_step` must satisfy 0 <= start_step < steps={steps}. Received: start_step={start_step}")
    index = tf.data.Dataset.range(start_epoch, max(start_epoch, epochs)).flat_map(index_batches).skip(start_step)
    ds = _read_batches(index, data.x_train, data.y_train, _batches_per_gather(data.x_train, batch_size), data.scale)
    return ds.prefetch(2), steps


def test_dataset(data, batch_size=256, rank=0, size=1):
    """This rank's shard of the test set: samples rank, rank+size, ... in batches.

    Shards differ by at most one sample; ``callbacks.GlobalEvaluationMetrics``
    turns the per-rank metric state into the figures of the whole test set.
    ``ImageFiles`` come one image per batch.
    """
    num_test = len(data.y_test)
    if num_test < size:
        raise DataError(f"the test set holds {num_test} samples: fewer than the {size} ranks that share it")
    if data.variable_size:
        batch_size = 1
    index = tf.data.Dataset.from_tensor_slices(np.arange(rank, num_test, size, dtype=np.int64))
    return _read_batches(index.batch(batch_size), data.x_test, data.y_test, scale=data.scale)
