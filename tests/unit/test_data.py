import ctypes
import gc

import numpy as np
import pytest

from hvd_easgd.app import data

pytestmark = pytest.mark.unit


def test_digits_split_is_fixed_stratified_and_seed_independent():
    a, b = data.digits(), data.digits()
    assert a.x_train.shape == (1437, 8, 8, 1) and a.x_test.shape == (360, 8, 8, 1)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    counts = np.bincount(a.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified: ~36 per class
    assert float(a.x_train.max()) == 1.0 and float(a.x_train.min()) == 0.0


def test_shards_are_disjoint_equal_and_reshuffled_per_epoch():
    n, size, batch = 1437, 2, 32
    steps = data.steps_per_epoch(n, batch, size)
    assert steps == 22  # 718 per rank // 32
    shards = [data.epoch_indices(n, 0, 0, r, size, steps, batch) for r in range(size)]
    assert all(len(s) == steps * batch for s in shards)
    assert not set(shards[0]) & set(shards[1])
    again = data.epoch_indices(n, 0, 0, 0, size, steps, batch)
    np.testing.assert_array_equal(shards[0], again)
    assert not np.array_equal(shards[0], data.epoch_indices(n, 0, 1, 0, size, steps, batch))


def test_accumulation_windows_cover_the_largest_shard():
    assert data.accumulation_windows([9, 3], 4) == 3
    assert data.accumulation_windows([8, 8], 4) == 2


def test_npz_with_and_without_test_arrays(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.random((50, 6, 6)), y=np.arange(50) % 5)
    d = data.load(f"npz:{path}")
    assert d.x_train.shape == (40, 6, 6, 1) and d.num_classes == 5
    np.savez(path, x=rng.random((30, 4, 4, 2)), y=np.arange(30) % 3, x_test=rng.random((6, 4, 4, 2)),
             y_test=np.arange(6) % 3)
    d = data.load(f"npz:{path}")
    assert len(d.y_train) == 30 and len(d.y_test) == 6


@pytest.mark.parametrize("make, message", [
    (None, "no such file"),
    (lambda p: np.savez(p, images=np.zeros((4, 2, 2)), labels=np.zeros(4)), r"missing array\(s\) \['x', 'y'\]"),
    (lambda p: np.savez(p, x=np.zeros((4, 2, 2)), y=np.zeros(3, int)), "`y` must have shape"),
    (lambda p: np.savez(p, x=np.zeros((4, 2)), y=np.zeros(4, int)), "`x` must have shape"),
    (lambda p: p.write_bytes(b"not a zip"), "not a readable .npz"),
])
def test_bad_npz_gets_one_clear_error(tmp_path, make, message):
    path = tmp_path / "bad.npz"
    if make:
        make(path)
    with pytest.raises(data.DataError, match=message):
        data.load(f"npz:{path}")


def _write_images(root, sizes, classes=("cat", "dog")):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    written = {}
    for cls in classes:
        (root / cls).mkdir()
        for i, (h, w) in enumerate(sizes):
            img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
            path = root / cls / f"{i}.png"
            tf.io.write_file(str(path), tf.io.encode_png(img))
            written[str(path)] = img
    return written


def test_image_folder_streams_mixed_sizes_from_disk(tmp_path):
    written = _write_images(tmp_path, [(10 + i, 12 + 2 * i) for i in range(5)])
    d = data.load(f"images:{tmp_path}")
    assert d.variable_size and d.num_classes == 2 and len(d.y_train) + len(d.y_test) == 10
    assert isinstance(d.x_train, data.ImageFiles) and d.input_shape == (None, None, 3)  # names, not pixels
    ds, steps = data.training_dataset(d, 1, seed=0, rank=0, size=1, start_epoch=0, epochs=1)
    assert ds.element_spec[0].shape.as_list() == [1, None, None, 3]
    order = data.epoch_indices(len(d.y_train), 0, 0, 0, 1, steps, 1)
    shapes = set()
    for i, (x, y) in zip(order, ds):
        expected = written[str(d.x_train.paths[i])].astype(np.float32) / 255.0  # PNG is lossless
        np.testing.assert_array_equal(x.numpy()[0], expected)
        assert y.numpy().tolist() == [d.y_train[i]]
        shapes.add(x.shape)
    assert len(shapes) > 1
    test_labels = [y.numpy()[0] for _, y in data.test_dataset(d, rank=1, size=2)]
    assert test_labels == d.y_test[1::2].tolist()


def test_a_file_that_is_no_image_gets_one_clear_error_at_start_up(tmp_path):
    _write_images(tmp_path, [(8, 8)] * 3)
    (tmp_path / "dog" / "notes.png").write_bytes(b"this is text, not a PNG")
    with pytest.raises(data.DataError, match=r"cannot decode dog/notes.png: not a PNG or JPEG file"):
        data.load(f"images:{tmp_path}")


def test_unknown_data_spec():
    with pytest.raises(data.DataError, match="--data must be"):
        data.load("mnist")


def test_each_epoch_of_the_pipeline_starts_at_its_own_permutation():
    # steps below the maximum (as when rounding down to whole accumulation windows)
    d = data.digits()
    ds, steps = data.training_dataset(d, 32, seed=1, rank=0, size=2, start_epoch=0, epochs=3, steps=21)
    labels = np.concatenate([y.numpy() for _, y in ds])
    assert steps == 21 and len(labels) == 3 * 21 * 32
    resumed, _ = data.training_dataset(d, 32, seed=1, rank=0, size=2, start_epoch=2, epochs=3, steps=21)
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in resumed]), labels[2 * 21 * 32:])


# --- the training pipeline: lazy per epoch, bit-identical to the materialised order -----------------
def _materialised_batches(dataset, batch, seed, rank, size, start_epoch, epochs, steps):
    """The batches as the first release built them: every remaining epoch's shard gathered up
    front (``x_train[index]`` over epochs × steps × batch), from float32 data."""
    n = len(dataset.y_train)
    index = np.concatenate([data.epoch_indices(n, seed, e, rank, size, steps, batch)
                            for e in range(start_epoch, epochs)])
    x = dataset.x_train.astype(np.float32)[index]
    return x.reshape(-1, batch, *x.shape[1:]), dataset.y_train[index].reshape(-1, batch)


@pytest.mark.parametrize("dtype", [np.uint8, np.float64, np.float32])
@pytest.mark.parametrize("rank, size, start_epoch, epochs, steps", [
    (0, 1, 0, 3, None), (1, 3, 2, 5, None), (2, 3, 1, 4, 2),
])
def test_pipeline_batches_are_bit_identical_to_the_materialised_order(dtype, rank, size, start_epoch, epochs, steps):
    rng = np.random.default_rng(7)
    if dtype == np.uint8:
        x = rng.integers(0, 256, (103, 5, 4, 3)).astype(np.uint8)
    else:  # values that need rounding on the way to float32
        x = (rng.standard_normal((103, 5, 4, 3)) * 1e3).astype(dtype) / 7
    y = rng.integers(0, 4, 103).astype(np.int64)
    dataset = data.Dataset("small", x, y, x[:10], y[:10], num_classes=4)
    ds, steps = data.training_dataset(dataset, 8, seed=3, rank=rank, size=size, start_epoch=start_epoch,
                                      epochs=epochs, steps=steps)
    got = [(bx.numpy(), by.numpy()) for bx, by in ds]
    want_x, want_y = _materialised_batches(dataset, 8, 3, rank, size, start_epoch, epochs, steps)
    assert len(got) == len(want_x) == (epochs - start_epoch) * steps
    for (bx, by), wx, wy in zip(got, want_x, want_y):
        assert bx.dtype == np.float32 and by.dtype == np.int64
        assert bx.tobytes() == wx.tobytes() and np.array_equal(by, wy)


def _rss_bytes():
    # Memory freed but still held by glibc's allocator (what earlier tests in this worker left
    # fragmented) goes back to the system first: the test is about what the pipeline keeps.
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _first_batches(dataset, epochs, count=5):
    ds, _ = data.training_dataset(dataset, 32, seed=0, rank=0, size=2, start_epoch=0, epochs=epochs)
    for i, (x, _) in enumerate(ds):
        if i + 1 == count:
            return x.shape


def test_pipeline_memory_does_not_grow_with_the_number_of_epochs():
    # 256 MiB of uint8 images: one more copy of the data (or of a rank's shard, 128 MiB, or of a float32
    # cast of either) would exceed the margin; 200 epochs of it would not fit in the machine at all.
    n = 87_382
    big = data.Dataset("big", np.ones((n, 32, 32, 3), np.uint8), np.arange(n, dtype=np.int64) % 10,
                       np.ones((10, 32, 32, 3), np.uint8), np.arange(10, dtype=np.int64), num_classes=10)
    small = data.Dataset("small", big.x_train[:640], big.y_train[:640], big.x_test, big.y_test, num_classes=10)
    _first_batches(small, epochs=2)  # TF's runtime and thread pools, before the baseline
    margin = 32 * 2**20
    baseline = _rss_bytes()
    for epochs in (1, 200):
        assert _first_batches(big, epochs) == (32, 32, 32, 3)
        grown = _rss_bytes() - baseline
        assert grown < margin, f"{epochs} epoch(s): RSS grew by {grown / 2**20:.0f} MiB (margin 32 MiB)"


def test_npz_keeps_the_files_dtype_and_batches_come_as_float32(tmp_path):
    x = np.arange(40 * 3 * 3, dtype=np.uint8).reshape(40, 3, 3)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(40) % 2)
    d = data.load(f"npz:{tmp_path / 'd.npz'}")
    assert d.x_train.dtype == np.uint8 and d.x_train.shape == (32, 3, 3, 1)
    bx, by = next(iter(data.test_dataset(d, batch_size=8)))
    assert bx.dtype == np.float32 and by.dtype == np.int64
    np.testing.assert_array_equal(bx.numpy(), d.x_test.astype(np.float32))  # values unchanged: 0..255
    with pytest.raises(data.DataError, match="`x` must hold integers or floats; got dtype <U1"):
        np.savez(tmp_path / "s.npz", x=np.full((4, 2, 2), "a"), y=np.zeros(4, int))
        data.load(f"npz:{tmp_path / 's.npz'}")


@pytest.mark.parametrize("num_test, size", [(10, 1), (10, 3), (7, 2), (3, 3)])
def test_test_set_shards_are_strided_cover_everything_once_and_differ_by_at_most_one(num_test, size):
    x = np.arange(num_test, dtype=np.float64)[:, None, None, None]
    d = data.Dataset("t", x, np.arange(num_test), x, np.arange(num_test) + 100, num_classes=200)
    shards = []
    for rank in range(size):
        batches = list(data.test_dataset(d, batch_size=2, rank=rank, size=size))
        xs = np.concatenate([bx.numpy().ravel() for bx, _ in batches])
        ys = np.concatenate([by.numpy() for _, by in batches])
        np.testing.assert_array_equal(xs, np.arange(rank, num_test, size))
        np.testing.assert_array_equal(ys, np.arange(rank, num_test, size) + 100)
        shards.append(len(xs))
    assert sum(shards) == num_test and max(shards) - min(shards) <= 1


def test_a_test_set_smaller_than_the_number_of_ranks_is_refused():
    x = np.zeros((2, 1, 1, 1))
    d = data.Dataset("t", x, np.zeros(2, np.int64), x, np.zeros(2, np.int64), num_classes=1)
    with pytest.raises(data.DataError, match="the test set holds 2 samples: fewer than the 3 ranks"):
        data.test_dataset(d, rank=0, size=3)


def test_teacher_is_fixed_balanced_and_labelled_by_its_network():
    a, b = data.teacher(train_size=2000, test_size=500), data.teacher(train_size=2000, test_size=500)
    assert a.x_train.shape == (2000, data.TEACHER_INPUT_DIM) and a.x_test.shape == (500, data.TEACHER_INPUT_DIM)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    np.testing.assert_array_equal(np.bincount(a.y_train, minlength=10), [200] * 10)
    np.testing.assert_array_equal(np.bincount(a.y_test, minlength=10), [50] * 10)
    assert not set(map(bytes, a.x_train)) & set(map(bytes, a.x_test))  # the split is disjoint
    other = data.teacher(train_size=2000, test_size=500, seed=1)
    assert not np.array_equal(other.x_train, a.x_train)


def test_teacher_labels_are_a_function_of_the_inputs():
    # the labels are not noise: a least-squares linear classifier fitted on the training set does far
    # better than chance (0.1) on the test set (about 0.68 at these sizes; the ReLU student gets > 0.9)
    d = data.teacher(train_size=5000, test_size=500)
    design = lambda x: np.c_[x, np.ones(len(x))]  # noqa: E731
    w = np.linalg.lstsq(design(d.x_train), np.eye(10)[d.y_train], rcond=None)[0]
    assert (np.argmax(design(d.x_test) @ w, 1) == d.y_test).mean() > 0.5


def test_teacher_margin_drops_the_samples_near_the_boundary():
    # without the margin the same pool keeps samples a wider margin would drop: the sets differ
    near, far = data.teacher(train_size=1000, test_size=500, margin=0.0), data.teacher(train_size=1000, test_size=500)
    assert not np.array_equal(near.x_train, far.x_train)
    np.testing.assert_array_equal(np.bincount(near.y_train, minlength=10), [100] * 10)


def test_teacher_sizes_must_divide_into_classes():
    with pytest.raises(data.DataError, match="`train_size` must be a multiple of num_classes=10"):
        data.teacher(train_size=1001, test_size=500)
