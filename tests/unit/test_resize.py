"""Resize for every strategy: p saved ranks continue at q, every variable by its strategy's rule.

Each case builds the p-rank state on SimulatedCluster (each rank its own data,
so the local weights, slots and window sums differ), saves it through
``checkpoint.save`` mid-period and mid-window, restores it at q on another
SimulatedCluster, compares every variable with the NumPy reference mapping
(``reference.resized_state_reference``), then takes steps at q and compares
them with NumPy steps from the reference state.
"""
import keras
import numpy as np
import pytest

import hvd_easgd
import tests.reference as ref
from tests import least_squares
from hvd_easgd import EASGD, GradientAccumulation, SyncAverage, checkpoint, resize
from hvd_easgd.comm.simulated_comm import SimulatedCluster
from hvd_easgd.strategies import DiLoCo, Hierarchical, PeriodicAverage, WarmUp

# slow: a p-rank run saved and restored at q ranks, case after case: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]

LR, MOMENTUM, BATCH, TAU = 0.05, 0.9, 4, 3


def ranks_of(cluster, make_strategy, w0, seed):
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
        model.layers[0].kernel.assign(w0.reshape(-1, 1) + seed)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM), make_strategy(),
                                                   comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    return models, opts


def train(cluster, models, opts, shards, steps, start=0):
    least_squares.train(cluster, models, opts, shards, steps, BATCH, start)


def key_of(model, opt):
    """id(variable) -> its checkpoint key."""
    return {id(v): f"{group}/{i:05d}" for group, variables in checkpoint.state_groups(model, opt).items()
            for i, v in enumerate(variables)}


def saved_then_resized(tmp_path, make_strategy, p, q, steps, ranks_per_host=None):
    """p ranks train ``steps`` micro-batches and save mid-epoch; q fresh ranks restore.
    Returns (the p saved states, the q ranks' models and optimizers, q's cluster, q's shards)."""
    shards, w0 = ref.least_squares_shards(max(p, q))
    cluster = SimulatedCluster(p)
    models, opts = ranks_of(cluster, make_strategy, w0, 0.0)
    train(cluster, models, opts, shards[:p], steps)
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], opts[r].comm, {},
                                          step_in_epoch=steps, steps_per_epoch=100))
    saved = [checkpoint.state_arrays(m, o) for m, o in zip(models, opts)]
    manifest, directory = checkpoint.latest(str(tmp_path))
    assert manifest["num_ranks"] == p and manifest["step_in_epoch"] == steps
    resized = SimulatedCluster(q, ranks_per_host=ranks_per_host)
    new_models, new_opts = ranks_of(resized, make_strategy, w0, 50.0)  # other weights: the restore must set them
    resized.run(lambda r: checkpoint.restore(directory, manifest, new_models[r], new_opts[r], new_opts[r].comm))
    return saved, new_models, new_opts, resized, shards[:q]


def assert_state(models, opts, expected):
    for r, (model, opt) in enumerate(zip(models, opts)):
        got = checkpoint.state_arrays(model, opt)
        assert sorted(got) == sorted(expected[r])
        for key, value in expected[r].items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"rank {r}, {key}")


def grads_at(ws, shards, t):
    return [ref.grad(w, *ref.batch(shard, t, BATCH)) for w, shard in zip(ws, shards)]


def momentum_step(w, m, g):
    """Keras SGD with momentum: m <- mu m - lr g; w <- w + m."""
    m = MOMENTUM * m - LR * g
    return w + m, m


def assert_close(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert np.linalg.norm(got - expected) <= 1e-5 * np.linalg.norm(expected), (got, expected)


# --- the rules, by hand -------------------------------------------------------------------------------
def test_each_rule_gives_what_its_name_says():
    saved = [np.float32([1.0, 4.0]), np.float32([2.0, 0.0]), np.float32([0.0, 2.0])]
    same = [np.float32([0.5])] * 3
    counts = [np.int64(3), np.int64(1), np.int64(2)]
    for rank in (0, 1):
        np.testing.assert_array_equal(resize.DEFAULT(saved, 2, rank), [1.0, 2.0])
        assert resize.DEFAULT(same, 2, rank) is same[0]
        assert resize.DEFAULT(counts, 2, rank) == 3  # integers that differ: rank 0's
        np.testing.assert_array_equal(resize.MEAN(saved, 2, rank), [1.0, 2.0])
        np.testing.assert_array_equal(resize.FIRST(saved, 2, rank), [1.0, 4.0])
        np.testing.assert_array_equal(resize.RESTART_AT_ZERO(saved, 2, rank), [0.0, 0.0])
    np.testing.assert_array_equal(resize.SUM_ON_FIRST(saved, 2, 0), [3.0, 6.0])
    np.testing.assert_array_equal(resize.SUM_ON_FIRST(saved, 2, 1), [0.0, 0.0])
    assert resize.SUM_ON_FIRST(counts, 2, 0) == 6 and resize.SUM_ON_FIRST(counts, 2, 1) == 0
    assert resize.SUM_ON_FIRST(saved, 2, 0).dtype == np.float32
    states = [{"w": w, "n": n} for w, n in zip(saved, counts)]
    got = resize.resized_states(states, {"n": resize.SUM_ON_FIRST}, 2)
    assert [int(s["n"]) for s in got] == [6, 0]
    np.testing.assert_array_equal(got[1]["w"], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"`rank` must satisfy 0 <= rank < ranks=2. Received: rank=2"):
        resize.resized_state(states, {}, 2, 2)


def test_a_strategy_declares_a_rule_in_one_line_and_composites_collect_their_childrens():
    accumulation = GradientAccumulation(3, strategy=EASGD(TAU))
    cluster = SimulatedCluster(2)
    models, opts = ranks_of(cluster, lambda: GradientAccumulation(3, strategy=EASGD(TAU)), np.zeros(ref.DIM), 0.0)
    accumulation = opts[0].strategy
    rules = accumulation.resize_rules()
    assert {rules[id(v)] for v in accumulation.accumulators + [accumulation.accumulated_samples]} == {
        resize.SUM_ON_FIRST}
    assert len(rules) == 2  # the rest follow resize.DEFAULT
    inner = accumulation.strategy
    inner.set_resize_rule(resize.RESTART_AT_ZERO, inner.center)  # e.g. an error-feedback residual
    by_key = checkpoint.resize_rules(models[0], opts[0])
    keys = key_of(models[0], opts[0])
    assert by_key[keys[id(inner.center[0])]] is resize.RESTART_AT_ZERO
    assert WarmUp(EASGD(TAU), 2).resize_rules() == {}


# --- p -> q for every strategy -----------------------------------------------------------------------
def reference(saved, q, sum_on_first=(), weights_from=None):
    """The q ranks' expected states (reference.resized_state_reference)."""
    return [ref.resized_state_reference(saved, q, r, sum_on_first, weights_from) for r in range(q)]


@pytest.mark.parametrize("p, q", [(3, 1), (3, 2), (2, 3)])
def test_sync_average_keeps_the_state_every_rank_shares(tmp_path, p, q):
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, SyncAverage, p, q, steps=5)
    assert all(saved[0].keys() == s.keys() and all(np.array_equal(saved[0][k], s[k]) for k in s) for s in saved)
    assert_state(models, opts, reference(saved, q))
    keys = key_of(models[0], opts[0])
    w, m = saved[0][keys[id(models[0].layers[0].kernel)]].ravel(), saved[0][keys[id(opts[0].variables[-1])]]
    train(cluster, models, opts, shards, 1, start=5)
    expected, _ = momentum_step(w, m.ravel(), np.mean(grads_at([w] * q, shards, 5), axis=0))
    for model in models:
        assert_close(model.layers[0].kernel.numpy().ravel(), expected)


@pytest.mark.parametrize("p, q", [(3, 1), (3, 2), (2, 3)])
def test_easgd_restarts_from_the_center_keeps_the_tau_phase_and_takes_alpha_beta_over_q(tmp_path, p, q):
    # 5 steps, tau 3: the checkpoint falls between two elastic steps; step 6 at q is one
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, lambda: EASGD(TAU), p, q, steps=5)
    keys = key_of(models[0], opts[0])
    kernel, center = keys[id(models[0].layers[0].kernel)], keys[id(opts[0].strategy.center[0])]
    assert not np.array_equal(saved[0][kernel], saved[1][kernel])
    assert_state(models, opts, reference(saved, q, weights_from={kernel: center}))
    assert opts[0].strategy.moving_rate == pytest.approx(0.9 / q)
    c = saved[0][center].ravel().astype(np.float64)
    slot = np.mean([s[keys[id(opts[0].variables[-1])]] for s in saved], axis=0, dtype=np.float64).ravel()
    train(cluster, models, opts, shards, 1, start=5)
    xs = [momentum_step(c, slot, g)[0] for g in grads_at([c] * q, shards, 5)]
    alpha = 0.9 / q
    diffs = [alpha * (x - c) for x in xs]
    for model, x, d in zip(models, xs, diffs):
        assert_close(model.layers[0].kernel.numpy().ravel(), x - d)
    assert_close(opts[0].strategy.center[0].numpy().ravel(), c + np.sum(diffs, axis=0))


@pytest.mark.parametrize("p, q", [(3, 1), (2, 3)])
def test_periodic_average_takes_the_mean_and_averages_on_the_step_it_would_have(tmp_path, p, q):
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, lambda: PeriodicAverage(TAU), p, q, steps=5)
    keys = key_of(models[0], opts[0])
    kernel, slot_key = keys[id(models[0].layers[0].kernel)], keys[id(opts[0].variables[-1])]
    assert not np.array_equal(saved[0][kernel], saved[1][kernel])
    assert_state(models, opts, reference(saved, q))
    w = np.mean([s[kernel] for s in saved], axis=0, dtype=np.float64).ravel()
    slot = np.mean([s[slot_key] for s in saved], axis=0, dtype=np.float64).ravel()
    train(cluster, models, opts, shards, 1, start=5)  # t = 6: an average over the q ranks
    expected = np.mean([momentum_step(w, slot, g)[0] for g in grads_at([w] * q, shards, 5)], axis=0)
    for model in models:
        assert_close(model.layers[0].kernel.numpy().ravel(), expected)


@pytest.mark.parametrize("p, q", [(2, 1), (2, 3)])
def test_diloco_keeps_the_outer_state_and_the_mean_of_the_local_weights(tmp_path, p, q):
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, lambda: DiLoCo(TAU), p, q, steps=5)
    keys = key_of(models[0], opts[0])
    strategy = opts[0].strategy
    kernel, synced = keys[id(models[0].layers[0].kernel)], keys[id(strategy.synced[0])]
    outer_momentum = keys[id(strategy.outer_optimizer.variables[-1])]
    assert not np.array_equal(saved[0][kernel], saved[1][kernel])
    assert np.array_equal(saved[0][synced], saved[1][synced]) and np.any(saved[0][outer_momentum])
    assert_state(models, opts, reference(saved, q))
    x = np.mean([s[kernel] for s in saved], axis=0, dtype=np.float64).ravel()
    slot = np.mean([s[keys[id(opts[0].variables[-1])]] for s in saved], axis=0, dtype=np.float64).ravel()
    theta, outer_m = saved[0][synced].ravel().astype(np.float64), saved[0][outer_momentum].ravel()
    train(cluster, models, opts, shards, 1, start=5)  # t = 6: an outer step over the q ranks
    xs = [momentum_step(x, slot, g)[0] for g in grads_at([x] * q, shards, 5)]
    delta = np.mean([theta - xi for xi in xs], axis=0)
    outer_m = 0.7 * outer_m - 0.7 * delta  # Keras's Nesterov SGD at the defaults (0.7, 0.7)
    theta = theta + 0.7 * outer_m - 0.7 * delta
    for model in models:
        assert_close(model.layers[0].kernel.numpy().ravel(), theta)


@pytest.mark.parametrize("p, q", [(3, 1), (2, 3)])
def test_an_open_accumulation_window_counts_every_sample_once(tmp_path, p, q):
    # k = 3, 4 micro-batches: one window closed, the second holds 1 micro-batch per saved rank
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, lambda: GradientAccumulation(3), p, q,
                                                              steps=4)
    keys = key_of(models[0], opts[0])
    strategy = opts[0].strategy
    acc, samples = keys[id(strategy.accumulators[0])], keys[id(strategy.accumulated_samples)]
    assert [int(s[samples]) for s in saved] == [1] * p
    expected = reference(saved, q, sum_on_first=(acc, samples))
    assert int(expected[0][samples]) == p and all(int(e[samples]) == 0 for e in expected[1:])
    assert_state(models, opts, expected)
    kernel = keys[id(models[0].layers[0].kernel)]
    w, slot = saved[0][kernel].ravel(), saved[0][keys[id(opts[0].variables[-1])]].ravel()
    partial = np.sum([s[acc] for s in saved], axis=0, dtype=np.float64).ravel()
    train(cluster, models, opts, shards, 2, start=4)  # closes the window: p + 2q micro-batches in it
    new = np.sum(grads_at([w] * q, shards, 4), axis=0) + np.sum(grads_at([w] * q, shards, 5), axis=0)
    expected_w, _ = momentum_step(w, slot, (partial + new) / (p + 2 * q))
    for model in models:
        assert_close(model.layers[0].kernel.numpy().ravel(), expected_w)
    assert int(strategy.step_counter.numpy()) == 2 and int(strategy.accumulated_samples.numpy()) == 0


def test_hierarchical_refuses_only_groups_that_do_not_divide_and_an_alpha_that_diverges():
    # any group size, one group and groups of one included (tests/unit/test_resize_groups.py); by host,
    # the saved group size is read from the shards
    make = lambda n=2, inter=None: Hierarchical(SyncAverage(), inter or EASGD(TAU), ranks_per_group=n)  # noqa: E731
    for saved, ranks in ((4, 2), (4, 6), (6, 4), (2, 4), (4, 4)):
        assert make().resize_refusal(saved, ranks) is None
    assert Hierarchical(SyncAverage(), EASGD(TAU)).resize_refusal(4, 6) is None
    assert make(1).resize_refusal(2, 3) is None  # groups of one: EASGD's rule at p ranks
    assert make().resize_refusal(4, 5) == "--ranks-per-group 2 does not divide the 5 ranks of the resumed run"
    # a fixed alpha is checked at the new number of groups G' = q/n': 0.5 > 2/(4+1)
    refusal = make(1, EASGD(TAU, moving_rate=0.5)).resize_refusal(2, 4)
    assert refusal.startswith("--moving-rate 0.5 was fixed for 2 ranks, and at 4 ranks alpha > 2/(q+1) = 0.4: ")
    assert "\n" not in refusal and make(2, EASGD(TAU, moving_rate=0.5)).resize_refusal(2, 4) is None


def recut_reference(saved, key, n, groups, group, index, elements, across=None):
    """Shard ``index`` of the new group's value: each saved group's n shards concatenated in rank
    order, padding stripped, the groups combined by ``across`` (kept if equal, else their float64 mean)."""
    wholes = [np.concatenate([saved[g * n + j][key] for j in range(n)])[:elements]
              for g in range(len(saved) // n)]
    if across is not None:
        whole = across(wholes)
    elif all(np.array_equal(wholes[0], w) for w in wholes):
        whole = wholes[0]
    else:
        whole = np.mean(np.stack(wholes).astype(np.float64), axis=0).astype(wholes[0].dtype)
    m = -(-elements // n)
    padded = np.zeros(n * m, whole.dtype)
    padded[:elements] = whole
    return padded[index * m:(index + 1) * m]


def test_re_cut_concatenates_each_groups_shards_strips_the_padding_and_cuts_again():
    from hvd_easgd.strategies.shards import FlatShards, ReCut

    spec = [keras.Variable(np.zeros((7,), np.float32))]  # N = 7 cut in n = 3: m = 3, 2 padding zeros
    rng = np.random.default_rng(3)
    saved = []
    for g in range(2):  # 2 saved groups of 3, the padding zeros in each group's last shard
        whole = np.concatenate([rng.standard_normal(7), np.zeros(2)]).astype(np.float32)
        saved += [{"k": whole[j * 3:(j + 1) * 3]} for j in range(3)]
    for groups in (1, 2, 3):
        for rank in range(3 * groups):
            rule = ReCut(resize.DEFAULT, 3, lambda r: (r // 3, groups, FlatShards(spec, 3, r % 3)))
            got = rule([s["k"] for s in saved], 3 * groups, rank)
            expected = recut_reference(saved, "k", 3, groups, rank // 3, rank % 3, 7)
            np.testing.assert_array_equal(got, expected)
            assert got.dtype == np.float32
    zeros = ReCut(resize.RESTART_AT_ZERO, 3, lambda r: (0, 2, FlatShards(spec, 3, r)))
    np.testing.assert_array_equal(zeros([s["k"] for s in saved], 6, 2), np.zeros(3, np.float32))


INTERS = {"sync": SyncAverage, "easgd": lambda: EASGD(TAU), "periodic": lambda: PeriodicAverage(TAU),
          "diloco": lambda: DiLoCo(TAU),
          # compressed: PeriodicAverage's synced copy, and both's error-feedback residuals (per group: zeros)
          "periodic-int8": lambda: PeriodicAverage(TAU, compression="int8"),
          "diloco-int8": lambda: DiLoCo(TAU, compression="int8")}
RECUT_CASES = [(inter, p, q) for inter in sorted(INTERS) for p, q in ((4, 6), (6, 4))
               if "int8" not in inter or (p, q) == (4, 6)]


@pytest.mark.parametrize("inter, p, q", RECUT_CASES, ids=[f"{i}-{p}to{q}" for i, p, q in RECUT_CASES])
def test_a_sharded_hierarchical_run_re_cuts_its_inter_state_for_the_new_groups(tmp_path, inter, p, q):
    # groups of 2: 2 -> 3 groups and 3 -> 2; 5 steps, tau 3: between two synchronisations
    make = lambda: Hierarchical(SyncAverage(), INTERS[inter](), ranks_per_group=2)  # noqa: E731
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, make, p, q, steps=5)
    strategy = opts[0].strategy
    keys = key_of(models[0], opts[0])
    sharded = {keys[id(v)] for v in strategy._sharded_state()}
    assert bool(sharded) == (inter != "sync" and inter != "periodic")  # PeriodicAverage keeps a copy to compress
    feedback = getattr(strategy.inter, "error_feedback", None)
    residuals = {keys[id(v)] for v in feedback.residuals} if feedback is not None else set()
    assert residuals <= sharded and bool(residuals) == inter.endswith("int8")
    assert any(np.any(saved[0][key]) for key in residuals) == bool(residuals)
    layout_key, kernel = keys[id(strategy.shard_layout)], keys[id(models[0].layers[0].kernel)]
    center = keys[id(strategy.inter.center[0])] if inter == "easgd" else None
    for r, (model, opt) in enumerate(zip(models, opts)):
        expected = ref.resized_state_reference(saved, q, r)
        for key in sharded:
            expected[key] = recut_reference(saved, key, 2, q // 2, r // 2, r % 2, ref.DIM,
                                            (lambda wholes: np.zeros_like(wholes[0])) if key in residuals else None)
        expected[layout_key] = np.array([2, r % 2, 3, ref.DIM], np.int64)
        if center is not None:  # the weights restart from the whole center: any saved group's shards
            expected[kernel] = np.concatenate([saved[0][center], saved[1][center]]).reshape(ref.DIM, 1)
        got = checkpoint.state_arrays(model, opt)
        assert sorted(got) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"rank {r}, {key}")
    # shard state every group held alike is kept exactly (the center, theta, the outer slots)
    for key in sharded - residuals:
        wholes = {np.concatenate([s[key] for s in saved[g:g + 2]]).tobytes() for g in range(0, p, 2)}
        assert len(wholes) == 1, key
    if inter == "sync":  # the two-level allreduce: one step at q is flat SyncAverage's, to float tolerance
        w = saved[0][kernel].ravel()
        m = saved[0][keys[id(opts[0].variables[-1])]].ravel()
        train(cluster, models, opts, shards, 1, start=5)
        expected_w, _ = momentum_step(w, m, np.mean(grads_at([w] * q, shards, 5), axis=0))
        for model in models:
            assert_close(model.layers[0].kernel.numpy().ravel(), expected_w)
    else:  # it trains on: a synchronisation at step 6, after which each new group's ranks agree
        train(cluster, models, opts, shards, 1, start=5)
        for g in range(0, q, 2):
            np.testing.assert_array_equal(models[g].get_weights()[0], models[g + 1].get_weights()[0])
        assert all(np.all(np.isfinite(model.get_weights()[0])) for model in models)


def test_every_built_in_resizes_and_a_fixed_ranks_per_group_must_divide_the_new_size():
    for strategy in (SyncAverage(), EASGD(), PeriodicAverage(), DiLoCo(),
                     GradientAccumulation(2, strategy=DiLoCo()), WarmUp(PeriodicAverage(), 3)):
        assert strategy.resize_refusal(2, 3) is None, strategy


# --- the rest of a started epoch at another number of ranks ------------------------------------------------
def test_the_rest_of_an_epoch_at_q_ranks_sees_every_sample_of_the_epoch_once():
    from hvd_easgd.app import data

    n, b, k = 103, 4, 2
    dataset = data.Dataset("toy", np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1), np.arange(n), None, None, 2)
    p, s = 3, 5  # 5 micro-batches of 4 on each of 3 ranks: positions 0..59 of the epoch's order seen
    seen = np.concatenate([data.epoch_indices(n, 1, 2, r, p, 8, b)[: s * b] for r in range(p)])
    order = np.random.default_rng([1, 2]).permutation(n)
    assert sorted(seen) == sorted(order[: p * s * b])
    for q in (1, 2, 4):
        steps = data.steps_per_epoch(n, b, q) // k * k
        rest, first_step = data.rest_of_epoch(n, b, q, p * s * b, s, k, steps)
        assert (s + rest) % k == 0 and first_step == steps - rest and 0 < rest < steps
        parts = [np.concatenate([lab.numpy() for _, lab in data.rest_of_epoch_dataset(dataset, b, 1, r, q, 2,
                                                                                       p * s * b, rest)])
                 for r in range(q)]
        later = np.concatenate(parts)
        assert len(later) == q * rest * b and not set(later) & set(seen) and len(set(later)) == len(later)
        np.testing.assert_array_equal(sorted(later), sorted(order[p * s * b:p * s * b + q * rest * b]))
        # dropped at the end: what q ranks cannot split in whole micro-batches, plus fewer than 2k of them
        assert n - p * s * b - q * rest * b < q * b * 2 * k
    with pytest.raises(data.DataError, match="fewer than the 1 micro-batches of 4 that would close the open "
                                             "accumulation window"):
        data.rest_of_epoch(n, b, 4, 100, 5, 2, 12)


def test_a_sharded_hierarchical_run_resumes_bit_for_bit_at_the_same_size(tmp_path):
    # 2 groups of 2: each rank keeps its own shard of EASGD's center; a checkpoint at the same size
    # restores every shard where it was, and the run goes on as if it had never stopped
    make = lambda: Hierarchical(SyncAverage(), EASGD(TAU), ranks_per_group=2)  # noqa: E731
    saved, models, opts, cluster, shards = saved_then_resized(tmp_path, make, 4, 4, steps=5)
    assert_state(models, opts, saved)
    differs = [k for k in saved[0] if k.startswith("strategy/") and saved[0][k].shape == saved[1][k].shape
               and not np.array_equal(saved[0][k], saved[1][k])]
    assert differs, "the two ranks of a group hold different shards"
    train(cluster, models, opts, shards, 2, start=5)
    _, w0 = ref.least_squares_shards(4)
    straight_cluster = SimulatedCluster(4)
    straight, straight_opts = ranks_of(straight_cluster, make, w0, 0.0)
    train(straight_cluster, straight, straight_opts, shards, 7)
    for r, (a, b) in enumerate(zip(models, straight)):
        np.testing.assert_array_equal(a.get_weights()[0], b.get_weights()[0], err_msg=f"rank {r}")
