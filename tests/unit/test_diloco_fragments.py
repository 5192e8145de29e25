"""Streaming DiLoCo (DiLoCo(fragments=F)) on p = 3 simulated ranks: the fragment
schedule and exact weights against a NumPy reference (uncompressed, and int8/int4
with each fragment's error feedback), F = 1 against plain DiLoCo, the byte and
call account, a mid-period resume bit for bit, a resize 3 -> 2 by the documented
rule, and the refusals (the strategy's and train.py's)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, Hierarchical, checkpoint
from hvd_easgd.app import cli, errors
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies.diloco import fragment_layout
from tests import reference as ref

# slow: runs of several ranks through fragments, resumes and resizes: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]
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


def train(cluster, models, opts, shards, steps, start=0):
    for t in range(start, start + steps):
        def step(r):
            x, y = (tf.constant(a, tf.float32) for a in ref.batch(shards[r], t, BATCH))
            with tf.GradientTape() as tape:
                loss = 0.5 * tf.reduce_mean(tf.square(models[r](x) - y))
            opts[r].apply(tape.gradient(loss, models[r].trainable_variables), models[r].trainable_variables)
        cluster.run(step)


def fragment_masks(sizes, fragments):
    """Each fragment's elements of the flat weights (fragment_layout's whole variables)."""
    bounds = np.cumsum([0] + list(sizes))
    masks = []
    for indices in fragment_layout([np.zeros(n, np.float32) for n in sizes], fragments):
        mask = np.zeros(bounds[-1], bool)
        for i in indices:
            mask[bounds[i]:bounds[i + 1]] = True
        masks.append(mask)
    return masks


class FragmentsReference:
    """SGD(0.05) inner; fragment f (its element mask) syncs at t ≡ ⌊fτ/F⌋ (mod τ), t = 1, 2, ...:
    u_if = θ_f − x_if (+ e_if), mean = Σ_i Q(u_if)/p (the quantised allreduce's reference),
    e_if ← u_if − Q(u_if) for int8/int4, θ_f ← NesterovSGD_f(θ_f, mean), x_if ← θ_f.
    The state (xs, θ, each fragment's outer momentum and the residuals) may be set to resume."""

    def __init__(self, shards, w0, sizes, tau, fragments, name="none"):
        self.shards, self.tau, self.fragments, self.name = shards, tau, fragments, name
        self.masks = fragment_masks(sizes, fragments)
        self.xs, self.theta = [w0.copy() for _ in shards], w0.copy()
        self.outers = [ref.SGDRef(0.7, 0.7, nesterov=True) for _ in range(fragments)]
        self.residuals = [np.zeros_like(w0) for _ in shards]
        self.inner = ref.SGDRef(0.05)

    def run(self, steps, start=0):
        p, feedback = len(self.shards), self.name in ref.LEVELS
        for step in range(start, start + steps):
            self.xs = [self.inner.step(x, ref.grad(x, *ref.batch(s, step, BATCH))) for x, s in zip(self.xs, self.shards)]
            t = step + 1
            for f, mask in enumerate(self.masks):
                if t % self.tau != f * self.tau // self.fragments % self.tau:
                    continue
                payloads = [self.theta[mask] - x[mask] + e[mask] for x, e in zip(self.xs, self.residuals)]
                mean = ref.quantised_allreduce_reference(payloads, self.name) / p
                if feedback:
                    for e, u in zip(self.residuals, payloads):
                        e[mask] = u - ref.quantise_reference(u, self.name)
                self.theta[mask] = self.outers[f].step(self.theta[mask], mean)
                for x in self.xs:
                    x[mask] = self.theta[mask]
        return self.xs, self.theta


def fragments_reference(shards, w0, sizes, tau, fragments, steps):
    return FragmentsReference(shards, w0, sizes, tau, fragments).run(steps)


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


def flat(variables):
    return np.concatenate([np.asarray(v).ravel() for v in variables])


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_compressed_fragments_match_the_quantiser_with_per_fragment_error_feedback(name):
    # 2-element variables: a 1-element tensor would travel exact (quantised_allreduce.split_payload)
    p, tau, fragments, sizes, steps = 3, 4, 2, (2, 2, 2), 11  # f0 = w0, w2; f1 = w1 at t ≡ 2: 2 and 3 syncs
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = ranks(cluster, sizes, lambda: DiLoCo(tau, fragments=fragments, compression=name), w0)
    train(cluster, models, opts, shards, steps)
    reference = FragmentsReference(shards, w0, sizes, tau, fragments, name)
    xs, theta = reference.run(steps)
    for got, expected in zip(weights(models), xs):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    strategy = opts[0].strategy
    np.testing.assert_allclose(flat(strategy.kept_variables()), theta, rtol=1e-5, atol=1e-6)
    # each fragment has its own residuals, and each rank's are its own payload's
    assert [len(e.residuals) for e in strategy.error_feedbacks] == [len(ix) for ix in strategy.fragment_indices]
    for opt, expected in zip(opts, reference.residuals):
        feedbacks = opt.strategy.error_feedbacks
        got = np.zeros_like(expected)
        bounds = np.cumsum([0] + list(sizes))
        for feedback, indices in zip(feedbacks, opt.strategy.fragment_indices):
            for i, e in zip(indices, feedback.residuals):
                got[bounds[i]:bounds[i + 1]] = e.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.any(reference.residuals[0] != 0)
    # the account: per sync (p + 1) messages of the fragment's blocks and its exact flag, in 2 calls
    layout = strategy.fragment_indices
    syncs = [sum(1 for t in range(1, steps + 1) if t % tau == f * tau // fragments % tau) for f in range(fragments)]
    assert syncs == [2, 3]
    messages = [ref.quantised_message_bytes(sum(sizes[i] for i in ix), 1, name, p) for ix in layout]
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": sum(n * (p + 1) * m for n, m in zip(syncs, messages)),
                                  "calls": 2 * sum(syncs)}
    average = strategy.expected_traffic(models[0].trainable_variables, hosts=p).total
    assert average.bytes == pytest.approx(sum((p + 1) * m for m in messages) / tau, rel=1e-12)


def saved_mid_period(tmp_path, make_strategy, sizes, w0, shards, steps):
    cluster = SimulatedCluster(len(shards))
    models, opts = ranks(cluster, sizes, make_strategy, w0)
    train(cluster, models, opts, shards, steps)
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], opts[r].comm, {},
                                          step_in_epoch=steps, steps_per_epoch=100))
    return cluster, models, opts


def restored(tmp_path, q, make_strategy, sizes, w0):
    cluster = SimulatedCluster(q)
    models, opts = ranks(cluster, sizes, make_strategy, w0 + 50.0)  # other weights: the restore must set them
    manifest, directory = checkpoint.latest(str(tmp_path))
    cluster.run(lambda r: checkpoint.restore(directory, manifest, models[r], opts[r], opts[r].comm))
    return cluster, models, opts


def test_a_mid_period_resume_with_fragments_and_int4_continues_bit_for_bit(tmp_path):
    p, sizes, saved_at, more = 3, (2, 2, 2), 5, 4  # saved at t = 5 (f0 synced at 4, f1 at 2); then 6, 8
    make = lambda: DiLoCo(4, fragments=2, compression="int4")
    shards, w0 = ref.least_squares_shards(p)
    cluster, models, opts = saved_mid_period(tmp_path, make, sizes, w0, shards, saved_at)
    assert not np.array_equal(weights(models)[0], flat(opts[0].strategy.synced))  # mid-period: x ≠ θ
    again, resumed, resumed_opts = restored(tmp_path, p, make, sizes, w0)
    train(cluster, models, opts, shards, more, start=saved_at)
    train(again, resumed, resumed_opts, shards, more, start=saved_at)
    for a, b in zip(weights(models), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(opts, resumed_opts):
        state, state_again = a.strategy.state_variables(), b.strategy.state_variables()
        assert len(state) == len(state_again) > 0
        for x, y in zip(state, state_again):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_a_resize_3_to_2_keeps_every_fragments_outer_state_and_averages_the_local_weights(tmp_path):
    p, q, sizes, tau, saved_at, more = 3, 2, (2, 2, 2), 4, 5, 4
    make = lambda: DiLoCo(tau, fragments=2, compression="int4")
    assert make().resize_refusal(p, q) is None
    shards, w0 = ref.least_squares_shards(p)
    _, models, opts = saved_mid_period(tmp_path, make, sizes, w0, shards, saved_at)
    saved = [checkpoint.state_arrays(m, o) for m, o in zip(models, opts)]
    old = opts[0].strategy
    cluster, new_models, new_opts = restored(tmp_path, q, make, sizes, w0)
    keys = {id(v): key for group, variables in checkpoint.state_groups(new_models[0], new_opts[0]).items()
            for key, v in ((f"{group}/{i:05d}", v) for i, v in enumerate(variables))}
    residual_keys = {keys[id(e)] for f in new_opts[0].strategy.error_feedbacks for e in f.residuals}
    assert len(residual_keys) == len(sizes)  # int4 quantises every variable of > 1 element
    for r, (model, opt) in enumerate(zip(new_models, new_opts)):
        expected = ref.resized_state_reference(saved, q, r)
        for key in residual_keys:
            expected[key] = np.zeros_like(expected[key])
        got = checkpoint.state_arrays(model, opt)
        assert sorted(got) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"rank {r}, {key}")
    # by name: θ and every fragment's outer momentum kept, the local weights the mean of the 3
    new = new_opts[0].strategy
    np.testing.assert_array_equal(flat(new.synced), flat(old.synced))
    for before, after in zip(old.outer_optimizers, new.outer_optimizers):
        assert any(np.any(m.numpy()) for m in before.momentums)
        for a, b in zip(before.momentums, after.momentums):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    mean = np.mean(np.stack(weights(models)).astype(np.float64), axis=0).astype(np.float32)
    for got in weights(new_models):
        np.testing.assert_array_equal(got, mean)
    # then q ranks step on from there as the reference does (Δ over q, the phases kept)
    reference = FragmentsReference(shards[:q], w0, sizes, tau, 2, "int4")
    reference.xs, reference.theta = [mean.astype(np.float64) for _ in range(q)], flat(new.synced).astype(np.float64)
    bounds = np.cumsum([0] + list(sizes))
    for outer, optimizer, mask, indices in zip(reference.outers, new.outer_optimizers, reference.masks,
                                               new.fragment_indices):
        outer.m = np.concatenate([m.numpy().ravel() for m in optimizer.momentums])
        assert np.array_equal(np.flatnonzero(mask), np.concatenate([np.arange(bounds[i], bounds[i + 1])
                                                                     for i in indices]))
    xs, theta = reference.run(more, start=saved_at)  # t = 6 (fragment 1) and t = 8 (fragment 0) sync
    train(cluster, new_models, new_opts, shards[:q], more, start=saved_at)
    for got, expected in zip(weights(new_models), xs):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(flat(new.kept_variables()), theta, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "diloco", "--fragments", "11", "--tau", "10"],
     r"^`fragments` must be an integer with 1 <= fragments <= 10 \(tau\)\. Received: fragments=11$"),
    (["--strategy", "diloco", "--fragments", "0"],
     r"^`fragments` must be an integer with 1 <= fragments <= 10 \(tau\)\. Received: fragments=0$"),
    (["--strategy", "easgd", "--fragments", "2"], r"^--fragments is an option of --strategy diloco, not --strategy easgd$"),
    (["--strategy", "hierarchical", "--inter", "diloco", "--fragments", "2"],
     r"^`inter` must not split the variables into fragments: fragments do not apply across groups, where the inter "
     r"strategy holds one flat shard of the variables; use --strategy diloco --fragments F \(flat\) instead\. "
     r"Received: inter=DiLoCo\(.*fragments=2\)$"),
])
def test_train_py_refuses_bad_fragments_in_one_line_before_any_rank_starts(argv, message):
    with pytest.raises(errors.UsageError, match=message) as info:
        cli.make_strategy(cli.parse_args(argv))
    assert "\n" not in str(info.value)


def test_hierarchical_refuses_fragments_when_made_and_takes_one():
    with pytest.raises(ValueError, match=r"fragments do not apply across groups"):
        Hierarchical(inter=DiLoCo(4, fragments=2))
    assert Hierarchical(inter=DiLoCo(4, fragments=1)).inter.fragments == 1
    assert Hierarchical(inter=EASGD()).inter is not None
