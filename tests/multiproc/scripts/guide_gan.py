"""Runs under `horovodrun -np 2`: a GAN written as Keras's "customizing fit"
guide writes one (a custom compile with two optimizers, a train_step that
calls each optimizer's apply), distributed only as docs/keras.md says: init,
wrap both optimizers, add the callbacks, shard the data.

The discriminator trains under SyncAverage, the generator under EASGD. Each
rank writes OUT/rank<r>.json; tests/multiproc/test_keras_guides.py asserts.
"""
import sys
import traceback

import keras
import numpy as np
import tensorflow as tf

import hvd_easgd
from tests.multiproc.scripts.rank_checks import gathered_max_diff, write_rank_results

OUT = sys.argv[1]
comm = hvd_easgd.init(threads_per_rank=1)
RANK, SIZE = comm.rank, comm.size
results = {"rank": RANK}
LATENT, REAL_MEAN = 4, np.array([2.0, -1.0], np.float32)


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.seed_generator = keras.random.SeedGenerator(1000 + RANK)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real):
        batch = tf.shape(real)[0]
        noise = keras.random.normal((batch, LATENT), seed=self.seed_generator)
        fake = self.generator(noise)
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)

        noise = keras.random.normal((batch, LATENT), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((batch, 1)), self.discriminator(self.generator(noise)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)
        return {"d_loss": d_loss, "g_loss": g_loss}



def generated_mean_distance(generator):
    noise = np.random.default_rng(7).standard_normal((2000, LATENT)).astype(np.float32)
    return float(np.linalg.norm(generator.predict(noise, verbose=0).mean(axis=0) - REAL_MEAN))


keras.utils.set_random_seed(10 + RANK)  # different initial weights per rank: the broadcast must fix them
discriminator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)], name="discriminator")
generator = keras.Sequential([keras.Input((LATENT,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)], name="generator")
gan = GAN(discriminator, generator)
d_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.Adam(2e-3))
g_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.Adam(2e-3),
                                       strategy=hvd_easgd.EASGD(period=2))
gan.compile(d_optimizer=d_opt, g_optimizer=g_opt,
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))

real = np.random.default_rng(0).normal(REAL_MEAN, 0.5, size=(1280, 2)).astype(np.float32)
dataset = hvd_easgd.shard_dataset(tf.data.Dataset.from_tensor_slices(real)).batch(32)

# What the broadcast will give every rank: rank 0's initial generator.
start = [t.numpy() for t in comm.broadcast(list(generator.trainable_weights), root_rank=0)]
distance_before = comm.allgather_json(generated_mean_distance(generator))[0]
results["fit_error"] = None
try:
    gan.fit(dataset, epochs=8, verbose=0, callbacks=hvd_easgd.callbacks.defaults())
except Exception as err:  # noqa: BLE001 - recorded for the test to assert on
    results["fit_error"] = f"{type(err).__name__}: {err}"
    traceback.print_exc()

if results["fit_error"] is None:
    center = g_opt.strategy.center
    results["discriminator_maxdiff"] = gathered_max_diff(comm, discriminator.trainable_weights)
    results["d_optimizer_maxdiff"] = gathered_max_diff(comm, d_opt.variables)
    results["generator_center_maxdiff"] = gathered_max_diff(comm, center)
    results["both_synced_at_build"] = bool(d_opt.initial_state_synced and g_opt.initial_state_synced)
    results["g_steps"] = int(g_opt.strategy.step_counter.numpy())
    # The center moved from the broadcast start, and rank r's local weights are not the center.
    results["center_moved"] = float(max(np.max(np.abs(c.numpy() - s)) for c, s in zip(center, start)))
    results["local_minus_center"] = float(max(np.max(np.abs(c.numpy() - v.numpy()))
                                              for c, v in zip(center, generator.trainable_weights)))
    with hvd_easgd.KeptWeights(gan):
        results["distance_after"] = generated_mean_distance(generator)
    results["distance_before"] = distance_before

write_rank_results(OUT, RANK, results)
