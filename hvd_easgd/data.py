"""Training data: the embedded digits, synthetic images, npz files and image folders.

Every rank loads the same global split and reads its own shard of it. The
split has its own fixed seed (``SPLIT_SEED``), so ``--seed`` never moves it.
Each epoch the training set is permuted with (seed, epoch) and rank r takes
positions r, r+p, r+2p, ... of that permutation, truncated so that every rank
runs the same number of steps (the remainder is dropped): nobody waits in a
collective that the others never reach.
"""
import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

SPLIT_SEED = 20150222  # fixed: the split must not move with --seed
TEST_FRACTION = 0.2
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class DataError(ValueError):
    """The data the user pointed at cannot be used (one clear message)."""


@dataclass
class Dataset:
    name: str
    x_train: object  # ndarray (N, H, W, C), or a list of arrays of varying size
    y_train: np.ndarray
    x_test: object
    y_test: np.ndarray
    num_classes: int

    @property
    def variable_size(self):
        return isinstance(self.x_train, list)

    @property
    def input_shape(self):
        if self.variable_size:
            return (None, None, self.x_train[0].shape[-1])
        return tuple(self.x_train.shape[1:])


def _stratified_split(x, y):
    from sklearn.model_selection import train_test_split

    index = np.arange(len(y))
    try:
        train_idx, test_idx = train_test_split(index, test_size=TEST_FRACTION, random_state=SPLIT_SEED,
                                               stratify=y)
    except ValueError:  # a class too small to stratify: plain seeded split
        train_idx, test_idx = train_test_split(index, test_size=TEST_FRACTION, random_state=SPLIT_SEED)
    take = (lambda idx: [x[i] for i in idx]) if isinstance(x, list) else (lambda idx: x[idx])
    return take(train_idx), y[train_idx], take(test_idx), y[test_idx]


def digits():
    """scikit-learn's 1,797 handwritten 8×8 digits (shipped with the package, no download)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[..., None]
    y = bunch.target.astype(np.int64)
    return Dataset("digits", *_stratified_split(x, y), num_classes=10)


def synthetic(image_shape=(32, 32, 3), num_classes=10, train_size=2048, test_size=512, seed=0):
    """Random images with random labels: for throughput, not accuracy."""
    rng = np.random.default_rng(seed)
    make = lambda n: (rng.standard_normal((n, *image_shape), dtype=np.float32),  # noqa: E731
                      rng.integers(0, num_classes, n).astype(np.int64))
    x_train, y_train = make(train_size)
    x_test, y_test = make(test_size)
    return Dataset("synthetic", x_train, y_train, x_test, y_test, num_classes)


def npz(path):
    """``x``/``y`` arrays (and optionally ``x_test``/``y_test``) from an .npz file."""
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
    if y.ndim != 1 or len(y) != len(x):
        raise DataError(f"--data npz:{path}: `{yname}` must have shape ({len(x)},); got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise DataError(f"--data npz:{path}: `{yname}` must hold non-negative integer class labels")
    if len(x) == 0:
        raise DataError(f"--data npz:{path}: `{xname}` is empty")
    return x.astype(np.float32), y.astype(np.int64)


def image_folder(path):
    """A folder per class of PNG/JPEG images of any size, decoded with TF's own decoders."""
    if not os.path.isdir(path):
        raise DataError(f"--data images:{path}: no such directory")
    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    if len(classes) < 2:
        raise DataError(f"--data images:{path}: expected one sub-folder per class (at least 2); found {classes}")
    images, labels = [], []
    for label, cls in enumerate(classes):
        for fname in sorted(os.listdir(os.path.join(path, cls))):
            if not fname.lower().endswith(IMAGE_SUFFIXES):
                continue
            raw = tf.io.read_file(os.path.join(path, cls, fname))
            try:
                image = tf.io.decode_image(raw, channels=3, expand_animations=False)
            except tf.errors.InvalidArgumentError:
                raise DataError(f"--data images:{path}: cannot decode {cls}/{fname}") from None
            images.append(image.numpy().astype(np.float32) / 255.0)
            labels.append(label)
    if len(images) < 5:
        raise DataError(f"--data images:{path}: found {len(images)} images; need at least 5")
    x_train, y_train, x_test, y_test = _stratified_split(images, np.array(labels, dtype=np.int64))
    return Dataset("images", x_train, y_train, x_test, y_test, len(classes))


def load(spec, image_shape=(32, 32, 3), num_classes=10, seed=0):
    """``digits`` | ``synthetic`` | ``npz:PATH`` | ``images:DIR``."""
    if spec == "digits":
        return digits()
    if spec == "synthetic":
        return synthetic(image_shape, num_classes, seed=seed)
    kind, _, path = spec.partition(":")
    if kind == "npz" and path:
        return npz(path)
    if kind == "images" and path:
        return image_folder(path)
    raise DataError(f"--data must be digits, synthetic, npz:PATH or images:DIR. Received: {spec!r}")


# --- sharding -------------------------------------------------------------------
def steps_per_epoch(num_train, batch_size, size):
    """Steps every rank takes per epoch: the smallest shard, in whole batches."""
    return (num_train // size) // batch_size


def epoch_indices(num_train, seed, epoch, rank, size, steps, batch_size):
    """The training indices rank ``rank`` visits in ``epoch``, deterministic in (seed, epoch)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_train)
    return order[rank::size][: steps * batch_size]


def accumulation_windows(shard_sizes, k):
    """Windows of k micro-batches every rank must run so that all agree without
    communicating: enough for the largest shard. Windows do not span epochs."""
    return -(-max(shard_sizes) // k)


def _one_image_per_batch(images, labels, index):
    """Images of different sizes cannot be stacked: each becomes a batch of one,
    with None height and width so the step is not retraced per shape."""
    channels = images[0].shape[-1]

    def generate():
        for i in index:
            yield images[i][None], labels[i:i + 1]

    signature = (tf.TensorSpec((1, None, None, channels), tf.float32), tf.TensorSpec((1,), tf.int64))
    return tf.data.Dataset.from_generator(generate, output_signature=signature)


def training_dataset(data, batch_size, seed, rank, size, start_epoch, epochs, steps=None):
    """A tf.data pipeline over epochs [start_epoch, epochs) for this rank's shards.

    ``steps`` (default: ``steps_per_epoch``) is exactly what each epoch holds,
    so epoch e always starts at its own permutation, also on resume.
    Variable-size images take ``batch_size`` 1.
    """
    steps = steps_per_epoch(len(data.y_train), batch_size, size) if steps is None else steps
    index = np.concatenate([epoch_indices(len(data.y_train), seed, e, rank, size, steps, batch_size)
                            for e in range(start_epoch, epochs)]) if epochs > start_epoch else np.zeros(0, int)
    if data.variable_size:
        if batch_size != 1:
            raise ValueError(f"images of different sizes need batch_size 1. Received: batch_size={batch_size}")
        return _one_image_per_batch(data.x_train, data.y_train, index).prefetch(2), steps
    ds = tf.data.Dataset.from_tensor_slices((data.x_train[index], data.y_train[index]))
    return ds.batch(batch_size, drop_remainder=True).prefetch(2), steps


def test_dataset(data, batch_size=256):
    if data.variable_size:
        return _one_image_per_batch(data.x_test, data.y_test, range(len(data.y_test)))
    return tf.data.Dataset.from_tensor_slices((data.x_test, data.y_test)).batch(batch_size)
