import numpy as np
import pytest

from hvd_easgd import data

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


def test_image_folder_reads_mixed_sizes(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(5):
            img = (rng.random((10 + i, 12 + 2 * i, 3)) * 255).astype(np.uint8)
            tf.io.write_file(str(tmp_path / cls / f"{i}.png"), tf.io.encode_png(img))
    d = data.load(f"images:{tmp_path}")
    assert d.variable_size and d.num_classes == 2 and len(d.y_train) + len(d.y_test) == 10
    assert len({x.shape for x in d.x_train}) > 1


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
