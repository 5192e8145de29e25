"""`train.py --data images:DIR`: images of mixed sizes, one per micro-batch,
accumulated k at a time, under horovodrun -np 2."""
import json
import os

import numpy as np
import pytest

from tests.helpers import ROOT, horovodrun

pytestmark = pytest.mark.multiproc


def write_image_folder(root, per_class=24):
    """Two classes that a fully convolutional net can tell apart at any size:
    bright-centred blobs against dark-centred ones, in random sizes."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for label, cls in enumerate(["bright", "dark"]):
        os.makedirs(os.path.join(root, cls))
        for i in range(per_class):
            h, w = rng.integers(12, 33, size=2)
            img = rng.integers(0, 60, (h, w, 3)).astype(np.uint8)
            if label == 0:
                img[h // 4: 3 * h // 4, w // 4: 3 * w // 4] += 180
            encode = tf.io.encode_png if i % 2 else (lambda x: tf.io.encode_jpeg(x, quality=95))
            ext = "png" if i % 2 else "jpg"
            tf.io.write_file(os.path.join(root, cls, f"{i}.{ext}"), encode(img))


@pytest.mark.timeout(300)
def test_mixed_size_images_train_end_to_end(tmp_path):
    folder = str(tmp_path / "images")
    write_image_folder(folder)
    run_dir = str(tmp_path / "run")
    out = horovodrun([os.path.join(ROOT, "train.py"), "--data", f"images:{folder}", "--batch-size", "1",
                      "--accumulate", "4", "--epochs", "6", "--lr", "0.05", "--run-dir", run_dir], timeout=280)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    # 38 training images → 19 per rank → 16 micro-batches (4 windows of k = 4) per epoch
    assert metrics["epochs"][0]["collective_calls_per_step"] == pytest.approx(1 / 4)
    assert metrics["final"]["test_accuracy"] >= 0.8
