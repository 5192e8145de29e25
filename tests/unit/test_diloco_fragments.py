"""Streaming DiLoCo (DiLoCo(fragments=F)) on p = 3 simulated ranks: the fragment
schedule and exact weights against a NumPy reference, F = 1 against plain DiLoCo,
the byte and call account, and the refusals."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies.diloco import fragment_layout
from tests import reference as ref

pytestmark = pytest.mark.unit
BATCH = 4


class Pieces(keras.layers.Layer):
    """x @ w with w split into whole variables of the given sizes (one per piece)."""

    def __init__(self, sizes, **kwargs):
        super().__init__(**kwargs)
        self.sizes = sizes
        self.pieces = [self.add_weight(shape=(n,), initializer="zeros", name=f"w{k}") for k, n in enumerate(sizes)]

    def call(self, x):
        return tf.linalg.matvec(x, tf.concat(self.pieces, 0))


def ranks(cluster, sizes, make_strategy, w0):
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((ref.DIM,)), Pieces(sizes)])
        for v, part in zip(model.trainable_variables, np.split(w0 + 100.0 * comm.rank, np.cumsum(sizes)[:-1])):
            v.assign(part)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05), make_strategy(), comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return models, opts


def train(cluster, models, opts, shards, steps):
    for t in range(steps):
        def step(r):
            x, y = (tf.constant(a, tf.float32) for a in ref.batch(shards[r], t, BATCH))
            with tf.GradientTape() as tape:
                loss = 0.5 * tf.reduce_mean(tf.square(models[r](x) - y))
            opts[r].apply(tape.gradient(loss, models[r].trainable_variables), models[r].trainable_variables)
        cluster.run(step)


def fragments_reference(shards, w0, sizes, tau, fragments, steps):
    """SGD(0.05) inner; fragment f (its element mask) syncs at t ≡ ⌊fτ/F⌋ (mod τ), t = 1, 2, ...:
    Δ_f = mean_i(θ_f − x_if), θ_f ← NesterovSGD_f(θ_f, Δ_f), x_if ← θ_f."""
    p = len(shards)
    bounds = np.cumsum([0] + list(sizes))
    masks = []
    for indices in fragment_layout([np.zeros(n, np.float32) for n in sizes], fragments):
        mask = np.zeros(ref.DIM, bool)
        for i in indices:
            mask[bounds[i]:bounds[i + 1]] = True
        masks.append(mask)
    xs, theta = [w0.copy() for _ in range(p)], w0.copy()
    outers = [ref.SGDRef(0.7, 0.7, nesterov=True) for _ in range(fragments)]
    inner = ref.SGDRef(0.05)
    for step in range(steps):
        xs = [inner.step(x, ref.grad(x, *ref.batch(s, step, BATCH))) for x, s in zip(xs, shards)]
        t = step + 1
        for f, mask in enumerate(masks):
            if t % tau == f * tau // fragments % tau:
                delta = np.mean([theta - x for x in xs], axis=0)
                theta[mask] = outers[f].step(theta[mask], delta[mask])
                for x in xs:
                    x[mask] = theta[mask]
    return xs, theta


def weights(models):
    return [np.concatenate([v.numpy() for v in m.trainable_variables]) for m in models]


@pytest.mark.parametrize("tau, fragments, sizes", [(10, 3, (3, 2, 1)), (5, 5, (1,) * 6), (4, 2, (2, 2, 1, 1))])
def test_fragments_match_the_numpy_reference(tau, fragments, sizes):
    p, steps = 3, 2 * tau + 3
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = ranks(cluster, sizes, lambda: DiLoCo(tau, fragments=fragments), w0)
    train(cluster, models, opts, shards, steps)
    xs, theta = fragments_reference(shards, w0, sizes, tau, fragments, steps)
    for got, expected in zip(weights(models), xs):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    kept = np.concatenate([v.numpy() for v in opts[0].strategy.kept_variables()])
    np.testing.assert_allclose(kept, theta, rtol=1e-5, atol=1e-6)
    # bytes: each sync sends its fragment's elements and one flag, in one call
    layout = fragment_layout(models[0].trainable_variables, fragments)
    syncs = [sum(1 for t in range(1, steps + 1) if t % tau == f * tau // fragments % tau) for f in range(fragments)]
    expected_bytes = sum(n * 4 * (sum(sizes[i] for i in ix) + 1) for n, ix in zip(syncs, layout))
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": expected_bytes, "calls": sum(syncs)}
    strategy = opts[0].strategy
    peak = strategy.peak_sync_traffic(models[0].trainable_variables, p)
    assert peak == 4 * (max(sum(sizes[i] for i in ix) for ix in layout) + 1)
    average = strategy.expected_traffic(models[0].trainable_variables, hosts=p).total
    assert average.bytes == pytest.approx(4 * (ref.DIM + fragments) / tau)
    assert average.calls == pytest.approx(fragments / tau)


def test_one_fragment_is_plain_diloco_bit_for_bit():
    p, sizes = 3, (3, 2, 1)
    shards, w0 = ref.least_squares_shards(p)
    runs = []
    for make in (lambda: DiLoCo(4), lambda: DiLoCo(4, fragments=1)):
        cluster = SimulatedCluster(p)
        models, opts = ranks(cluster, sizes, make, w0)
        train(cluster, models, opts, shards, 9)
        runs.append((weights(models), [v.numpy() for v in opts[0].strategy.state_variables()]))
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        np.testing.assert_array_equal(a, b)
    assert "fragments" not in DiLoCo(4).get_config() and DiLoCo(4, fragments=2).get_config()["fragments"] == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"period": 10, "fragments": 0}, r"`fragments` must be an integer with 1 <= fragments <= 10 \(tau\)\. Received: fragments=0"),
    ({"period": 10, "fragments": 11}, r"`fragments` must be an integer .*<= 10.*Received: fragments=11"),
])
def test_bad_fragments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        DiLoCo(**kwargs)
    assert "\n" not in str(info.value)
