"""A decoder-only transformer language model (``--model transformer``), readable in one sitting.

GPT-2's shape with pre-norm blocks (Radford et al. 2019; nanoGPT's ``model.py``):

    h_0 = E[x] + P                              token and learned position embeddings
    h   = h + Attention(LayerNorm(h))            causal: position t attends to positions <= t
    h   = h + W_2 gelu(W_1 LayerNorm(h))         the MLP, 4 x the width
    logits = LayerNorm(h_L) W_out                next-token logits over the vocabulary

Every piece but the embedding is a built-in Keras 3 layer, so the model trains
under any strategy like any other Keras model. The token embedding's gradient is
``tf.IndexedSlices`` (the rows of the batch's tokens); the strategies densify it
before any collective (``strategies.base.as_dense``), which costs nothing here:
a byte vocabulary's table is 256 x width. The output layer is not tied to the
embedding, for the same reason: tying would save 256 x width parameters.

No dropout: the runs are short against the corpus (a few epochs), and without
it a step is a deterministic function of the weights and the batch, which exact
resume relies on. Initialisation follows GPT-2: N(0, 0.02) for the embeddings
and every kernel, the MLP's output projection scaled by 1/sqrt(2 L) (GPT-2 scales the
attention's too; Keras's MultiHeadAttention takes one initializer for all its kernels).

Loading a saved model.keras needs this module imported (``import
hvd_easgd.app.transformer``) for its one custom layer.
"""
import math

import keras
from keras import layers, ops

# The default size: 2 layers of width 64 with 4 heads over 128 bytes, 0.14 M
# parameters, so that an epoch of the Python docs (10.5 M training tokens) takes
# about 5 minutes at np = 2 on the 2-core machine the project is measured on
# (35 k tokens/s; width 128, 0.48 M parameters, ran at 15 k and would take 12).
DEFAULT_LAYERS = 2
DEFAULT_WIDTH = 64
DEFAULT_HEADS = 4
INIT_STDDEV = 0.02


@keras.saving.register_keras_serializable(package="hvd_easgd")
class TokenAndPositionEmbedding(layers.Layer):
    """E[x] + P[:length]: a token table and a learned position table, added."""

    def __init__(self, vocabulary_size, context, width, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size, self.context, self.width = vocabulary_size, context, width
        self.tokens = layers.Embedding(vocabulary_size, width, name="tokens",
                                       embeddings_initializer=keras.initializers.RandomNormal(stddev=INIT_STDDEV))

    def build(self, input_shape):
        self.tokens.build(input_shape)
        self.positions = self.add_weight(shape=(self.context, self.width), name="positions",
                                         initializer=keras.initializers.RandomNormal(stddev=INIT_STDDEV))

    def call(self, token_ids):
        length = ops.shape(token_ids)[-1]
        return self.tokens(token_ids) + self.positions[:length]

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.width)

    def get_config(self):
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size, "context": self.context,
                "width": self.width}


def transformer(context, vocabulary_size, layers_count=DEFAULT_LAYERS, width=DEFAULT_WIDTH, heads=DEFAULT_HEADS):
    """The language model: (batch, context) int32 token ids -> (batch, context, vocabulary) logits.

    Args:
      context: T, the tokens a sample holds (``--context``).
      vocabulary_size: V (256 for bytes).
      layers_count: L, transformer blocks (``--layers``).
      width: d, the residual stream's width (``--width``); a multiple of ``heads``.
      heads: attention heads (``--heads``), each of width d / heads.

    Parameters: V·d + T·d + L·(12 d² + 13 d) + 2 d + d·V + V.
    """
    if width % heads:
        raise ValueError(f"`width` must be a multiple of `heads`. Received: width={width}, heads={heads}")
    kernel = keras.initializers.RandomNormal(stddev=INIT_STDDEV)
    residual = keras.initializers.RandomNormal(stddev=INIT_STDDEV / math.sqrt(2 * layers_count))
    token_ids = keras.Input((context,), dtype="int32", name="tokens")
    h = TokenAndPositionEmbedding(vocabulary_size, context, width, name="embedding")(token_ids)
    for i in range(layers_count):
        x = layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_attention_norm")(h)
        x = layers.MultiHeadAttention(heads, width // heads, kernel_initializer=kernel, name=f"block{i}_attention")(
            x, x, use_causal_mask=True)
        h = layers.Add(name=f"block{i}_attention_residual")([h, x])
        x = layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_mlp_norm")(h)
        x = layers.Dense(4 * width, activation="gelu", kernel_initializer=kernel, name=f"block{i}_mlp_in")(x)
        x = layers.Dense(width, kernel_initializer=residual, name=f"block{i}_mlp_out")(x)
        h = layers.Add(name=f"block{i}_mlp_residual")([h, x])
    h = layers.LayerNormalization(epsilon=1e-5, name="final_norm")(h)
    logits = layers.Dense(vocabulary_size, kernel_initializer=kernel, name="logits")(h)
    return keras.Model(token_ids, logits, name="transformer")


def parameter_count(context, vocabulary_size, layers_count=DEFAULT_LAYERS, width=DEFAULT_WIDTH):
    """The model's parameters, from the formula in ``transformer``'s docstring."""
    v, t, d = vocabulary_size, context, width
    return v * d + t * d + layers_count * (12 * d * d + 13 * d) + 2 * d + d * v + v
