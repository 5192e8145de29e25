"""The transformer language model (``--model transformer``) and its cosine learning-rate schedule."""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvd_easgd.app import cli, trainer
from hvd_easgd.app.transformer import parameter_count, transformer

pytestmark = pytest.mark.unit


def _small(seed=0):
    keras.utils.set_random_seed(seed)
    return transformer(context=16, vocabulary_size=256, layers_count=2, width=32, heads=2)


def _tokens(seed, shape=(3, 16)):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.int32)


def test_no_position_sees_a_later_token():
    model = _small()
    tokens = _tokens(0)
    logits = model(tokens).numpy()
    for t in (1, 5, 15):
        changed = tokens.copy()
        changed[:, t:] = (changed[:, t:] + 1 + _tokens(t)[:, t:] % 255) % 256  # every later token differs
        assert (changed[:, t:] != tokens[:, t:]).all()
        other = model(changed).numpy()
        # before t: bit-identical (masked scores weigh exactly 0); from t on the inputs moved, and so do the logits
        assert other[:, :t].tobytes() == logits[:, :t].tobytes(), t
        assert not np.array_equal(other[:, t:], logits[:, t:]), t


@pytest.mark.parametrize("context, width, layers_count, heads, expected", [
    # V d + T d + L (12 d^2 + 13 d) + 2 d + d V + V, by hand:
    (16, 32, 1, 2, 8192 + 512 + 12704 + 64 + 8192 + 256),  # 29,920
    (128, 128, 2, 4, 32768 + 16384 + 2 * 198272 + 256 + 32768 + 256),  # 478,976
    (128, 64, 2, 4, 16384 + 8192 + 2 * 49984 + 128 + 16384 + 256),  # 141,312: the default size
])
def test_the_parameter_count_is_the_formula(context, width, layers_count, heads, expected):
    assert parameter_count(context, 256, layers_count, width) == expected
    assert transformer(context, 256, layers_count, width, heads).count_params() == expected


def test_the_default_size_is_141312_parameters():
    assert parameter_count(128, 256) == 141_312  # the docstring's 0.14 M
    assert transformer(128, 256).count_params() == 141_312


def test_width_must_divide_into_heads():
    with pytest.raises(ValueError, match="Received: width=10, heads=3"):
        transformer(16, 256, width=10, heads=3)


def test_only_the_token_embedding_has_a_sparse_gradient():
    model = _small()
    tokens = _tokens(1)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(tokens, model(tokens))
    grads = tape.gradient(loss, model.trainable_variables)
    sparse = [v.path for v, g in zip(model.trainable_variables, grads) if isinstance(g, tf.IndexedSlices)]
    assert sparse == ["embedding/tokens/embeddings"]  # the rows of the batch's tokens
    dense = [g for g in grads if not isinstance(g, tf.IndexedSlices)]
    assert len(dense) == len(grads) - 1 and all(isinstance(g, tf.Tensor) for g in dense)  # positions included


def test_a_saved_model_loads_with_the_same_logits(tmp_path):
    model = _small()
    tokens = _tokens(2)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("embedding").__class__.__name__ == "TokenAndPositionEmbedding"
    np.testing.assert_array_equal(loaded(tokens).numpy(), model(tokens).numpy())


# --- the cosine schedule ---------------------------------------------------------------------
def _text_config(**changes):
    """train.py's config for the transformer on text: Adam, the cosine schedule, a floor of 0.1."""
    config = cli.parse_args(["--data", "text:/etc/hostname", "--epochs", "2", "--lr", "0.01"])
    assert (config.model, config.lr_schedule, config.lr_floor, config.scale_lr) == ("transformer", "cosine", 0.1, False)
    return dataclasses.replace(config, **changes)


def _rates(optimizer, steps):
    out = []
    for step in steps:
        optimizer.iterations.assign(step)
        out.append(float(optimizer.learning_rate))
    return out


def test_the_cosine_schedule_warms_up_from_0_then_decays_to_the_floor():
    # U = 50 updates an epoch, 2 epochs: 100 updates; W = 10 of warm-up, then a cosine over 90
    optimizer = trainer._inner_optimizer(_text_config(lr_warmup_updates=10), size=1, updates_per_epoch=50)
    assert isinstance(optimizer, keras.optimizers.Adam)
    steps = [0, 5, 10, 55, 100, 150]
    want = [0.0,  # from 0
            0.005,  # halfway up: linear
            0.01,  # the peak, --lr
            (0.01 + 0.001) / 2,  # halfway down the cosine (10 + 90 / 2): cos(pi / 2) = 0
            0.001,  # the floor, 0.1 x the peak, at the last update ...
            0.001]  # ... and after it
    np.testing.assert_allclose(_rates(optimizer, steps), want, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("epochs, steps, accumulate, warmup", [
    (2, 50, 1, 5),  # 100 updates: 5% is 5
    (2, 50, 2, 2),  # 50 updates (2 micro-batches each): int(2.5)
    (1, 3999, 1, 199),  # int(199.95)
    (2, 10_000, 1, 200),  # 5% would be 1,000: at most 200
])
def test_the_default_warm_up_is_5_percent_of_the_updates_at_most_200(epochs, steps, accumulate, warmup):
    config = _text_config(epochs=epochs, accumulate=accumulate)
    assert trainer._resolve_warmup(config, steps).lr_warmup_updates == warmup
    # given, or no cosine: left alone
    assert trainer._resolve_warmup(dataclasses.replace(config, lr_warmup_updates=7), steps).lr_warmup_updates == 7
    constant = dataclasses.replace(config, lr_schedule="constant")
    assert trainer._resolve_warmup(constant, steps).lr_warmup_updates is None
