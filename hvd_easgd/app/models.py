"""Models by name, for train.py and the benchmarks. Any Keras 3 model works
with hvd_easgd; these are the ones the CLI offers (``--model``)."""
import keras
from keras import layers

from . import transformer as _transformer


def cnn(input_shape, num_classes, keras_api=keras):
    """The digits CNN (~38k parameters at 8×8×1): the default model.

    ``keras_api`` lets the benchmark's MWMS baseline build the same network
    with ``tf_keras`` (Keras 2), layer for layer.
    """
    api_layers = keras_api.layers
    return keras_api.Sequential([
        keras_api.Input(input_shape),
        api_layers.Conv2D(16, 3, padding="same", activation="relu"),
        api_layers.Conv2D(32, 3, padding="same", activation="relu"),
        api_layers.MaxPooling2D(2),
        api_layers.Flatten(),
        api_layers.Dense(64, activation="relu"),
        api_layers.Dense(num_classes),
    ], name="cnn")


def fcn(input_shape, num_classes):
    """Fully convolutional with global pooling: takes images of any height and width."""
    channels = input_shape[-1]
    return keras.Sequential([
        keras.Input((None, None, channels)),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(num_classes),
    ], name="fcn")


def resnet(input_shape, num_classes, width=16, blocks_per_stage=1):
    """A small ResNet (three stages of basic blocks) for 32×32 synthetic-image throughput."""
    inputs = keras.Input(input_shape)
    x = layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for stage in range(3):
        filters = width * 2 ** stage
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
            y = layers.BatchNormalization()(y)
            y = layers.ReLU()(y)
            y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
            y = layers.BatchNormalization()(y)
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
                shortcut = layers.BatchNormalization()(shortcut)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name="resnet")


def wide_mlp(input_shape, num_classes, hidden=(2560, 2048)):
    """A wide MLP: ~5.4 M parameters on 8×8 digits, so 21.7 MB of float32 gradients per step,
    yet only about 1 GFLOP per training step at batch 32 (forward and backward), tens of ms on one core.

    It is the model for measuring communication: on a slow link its sync step is
    dominated by moving the gradients, as a big model's is on a real cluster.
    """
    model_layers = [keras.Input(input_shape), layers.Flatten()]
    model_layers += [layers.Dense(width, activation="relu") for width in hidden]
    model_layers.append(layers.Dense(num_classes))
    return keras.Sequential(model_layers, name="wide_mlp")


def student_mlp(input_shape, num_classes, hidden=(1024, 1024)):
    """The student of ``--data teacher``: 1.09 M parameters at 32 inputs and 10 classes
    (32·1024 + 1024·1024 + 1024·10 weights and 2,058 biases), so 4.36 MB of float32
    gradients per step for about 1.7 GFLOP at batch 256 (forward and backward).

    At 100 Mbit/s a SyncAverage step at p = 2 moves 4.36 MB each way, about 0.35 s,
    against tens of milliseconds of compute: communication dominates (docs/benchmarks.md).
    """
    return wide_mlp(input_shape, num_classes, hidden)


def transformer(input_shape, num_classes, layers=_transformer.DEFAULT_LAYERS, width=_transformer.DEFAULT_WIDTH,
                heads=_transformer.DEFAULT_HEADS):
    """The decoder-only language model (``transformer.py``) over samples of ``input_shape`` = (context,)
    tokens, predicting ``num_classes`` = the vocabulary."""
    (context,) = input_shape
    return _transformer.transformer(context, num_classes, layers, width, heads)


MODELS = {"cnn": cnn, "fcn": fcn, "resnet": resnet, "wide_mlp": wide_mlp, "student_mlp": student_mlp,
          "transformer": transformer}


def build(name, input_shape, num_classes, **size):
    """Model ``name`` for the data's ``input_shape`` and ``num_classes``; ``size``: the model's own
    size options (the transformer's ``layers``, ``width``, ``heads``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(sorted(MODELS))}")
    return MODELS[name](input_shape, num_classes, **size)
