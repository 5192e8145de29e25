"""Hierarchical resumed in groups of another size: shards of n ranks <-> one variable per weight <-> shards of n'.

Each case trains a Hierarchical run on SimulatedCluster in one layout of
groups (2 groups of 2, ...), saves it through ``checkpoint.save`` between two
synchronisations, restores it in another layout (another group size, one
group, groups of one rank, another number of ranks or the same), and compares
every variable with a NumPy reference written from the rule alone: each saved
group's whole value of a per-weight inter state (its shards joined in rank
order, padding stripped; or the variable itself, unsharded), the inter
strategy's rule across the saved ranks (kept where alike, else the mean;
residuals zeros), then the new rank's shard or the variable. Then one step at
the new layout.
"""
import keras
import numpy as np
import pytest

import hvd_easgd
import tests.reference as ref
from tests import least_squares
from hvd_easgd import EASGD, GradientAccumulation, SyncAverage, checkpoint
from hvd_easgd.comm.simulated_comm import SimulatedCluster
from hvd_easgd.app import config_compare
from hvd_easgd.strategies import DiLoCo, Hierarchical, PeriodicAverage, regroup

# slow: a p-rank run saved and restored in groups of another size, case after case: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]

LR, MOMENTUM, BATCH, TAU, STEPS = 0.05, 0.9, 4, 3, 5

INTERS = {"sync": SyncAverage, "easgd": lambda: EASGD(TAU), "periodic": lambda: PeriodicAverage(TAU),
          "diloco": lambda: DiLoCo(TAU), "diloco-int8": lambda: DiLoCo(TAU, compression="int8")}

# (inter, saved ranks, saved group size, new ranks, new group size)
CASES = [(inter, 4, 2, 2, 1) for inter in ("sync", "easgd", "periodic", "diloco")] + [
    ("diloco", 4, 2, 2, 2),  # 2 x 2 -> one group of 2
    ("easgd", 4, 2, 4, 4),  # 2 x 2 -> one group of 4, at the same size
    ("easgd", 2, 1, 4, 2), ("diloco", 2, 1, 4, 2),  # groups of one -> 2 x 2
    ("easgd", 6, 2, 6, 3), ("sync", 6, 2, 6, 3),  # 3 x 2 -> 2 x 3, at the same size
    ("diloco-int8", 4, 2, 6, 3)]  # residuals per group: zeros


def ranks_of(cluster, make_strategy, w0, offset):
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
        model.layers[0].kernel.assign(w0.reshape(-1, 1) + offset)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM), make_strategy(),
                                                   comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    return models, opts


def keys_of(model, opt):
    """id(variable) -> its checkpoint key."""
    return {id(v): f"{group}/{i:05d}" for group, variables in checkpoint.state_groups(model, opt).items()
            for i, v in enumerate(variables)}


def roles(model, opt):
    """The strategy's keys by role: ``weight`` (the per-weight inter states, in order), ``residuals``,
    ``others`` (every other strategy key in order, the shard layout left out), ``layout`` (or None),
    ``inter_counter``, ``center`` (EASGD's, or None), ``kernel``."""
    strategy, keys = opt.strategy, keys_of(model, opt)
    shard = (strategy.layout.length,) if strategy.sharded else None
    weight = [keys[id(v)] for v in strategy.inter.state_variables()
              if tuple(v.shape) in ((ref.DIM, 1), shard) and v.dtype == "float32"]
    feedback = getattr(strategy.inter, "error_feedback", None)
    layout = keys[id(strategy.shard_layout)] if strategy.sharded else None
    return {"weight": weight, "layout": layout,
            "residuals": {keys[id(v)] for v in feedback.residuals} if feedback is not None else set(),
            "others": [keys[id(v)] for v in strategy.state_variables() if keys[id(v)] not in weight + [layout]],
            "inter_counter": keys[id(strategy.inter.step_counter)],
            "center": keys[id(strategy.inter.center[0])] if isinstance(strategy.inter, EASGD) else None,
            "kernel": keys[id(model.layers[0].kernel)]}


def default(values):
    """resize.DEFAULT written out: kept where alike (or not floating), else the float64 mean."""
    values = [np.asarray(v) for v in values]
    if all(np.array_equal(values[0], v) for v in values) or not np.issubdtype(values[0].dtype, np.floating):
        return values[0]
    return np.mean(np.stack(values).astype(np.float64), axis=0).astype(values[0].dtype)


def expected_states(saved, old, n, new, q, m):
    """Every new rank's state (new groups of ``m``), from the p saved states (groups of ``n``)
    and the rule alone; ``old``/``new``: the two runs' ``roles``."""
    p = len(saved)
    old_sharded = n > 1 and p // n > 1
    assert len(new["weight"]) == len(old["weight"]) and len(new["others"]) == len(old["others"])
    wholes = []  # per per-weight state: each saved rank's whole value (its group's)
    for key in old["weight"]:
        if old_sharded:  # the group's n shards in rank order, the padding stripped
            wholes.append([np.concatenate([saved[r - r % n + j][key] for j in range(n)])[:ref.DIM]
                           for r in range(p)])
        else:
            wholes.append([saved[r][key].ravel() for r in range(p)])
    length = -(-ref.DIM // m)
    out = []
    for r in range(q):
        state = {key: default([s[key] for s in saved]) for key in saved[0] if not key.startswith("strategy/")}
        for key, new_key in zip(old["others"], new["others"]):
            state[new_key] = default([s[key] for s in saved])
        if q // m == 1:  # the inter strategy never steps in one group: its counter restarts at 0
            state[new["inter_counter"]] = np.zeros_like(state[new["inter_counter"]])
        for values, key, new_key in zip(wholes, old["weight"], new["weight"]):
            whole = np.zeros_like(values[0]) if key in old["residuals"] else default(values)
            if new["layout"] is not None:
                padded = np.zeros(m * length, whole.dtype)
                padded[:ref.DIM] = whole
                state[new_key] = padded[(r % m) * length:(r % m + 1) * length]
            else:
                state[new_key] = whole.reshape(ref.DIM, 1)
            if new_key == new["center"] and q // m > 1:  # EASGD's weights restart from the whole center
                state[new["kernel"]] = default(values).reshape(ref.DIM, 1)
        if new["layout"] is not None:
            state[new["layout"]] = np.array([m, r % m, length, ref.DIM], np.int64)
        out.append(state)
    return out


def momentum_step(w, slot, g):
    slot = MOMENTUM * slot - LR * g
    return w + slot, slot


def saved_run(tmp_path, make_strategy, p, ranks_per_host=None):
    """p ranks train ``STEPS`` micro-batches and save mid-epoch: (shards, w0, models, opts, manifest, directory)."""
    shards, w0 = ref.least_squares_shards(6)
    cluster = SimulatedCluster(p, ranks_per_host=ranks_per_host)
    models, opts = ranks_of(cluster, make_strategy, w0, 0.0)
    least_squares.train(cluster, models, opts, shards[:p], STEPS, BATCH)  # tau 3: between two synchronisations
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], opts[r].comm, {},
                                          step_in_epoch=STEPS, steps_per_epoch=100))
    return (shards, w0, models, opts) + checkpoint.latest(str(tmp_path))


@pytest.mark.parametrize("inter, p, n, q, m", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}to{c[3]}x{c[4]}" for c in CASES])
def test_hierarchical_resumes_in_groups_of_another_size(tmp_path, inter, p, n, q, m):
    check_resume(tmp_path, inter, p, n, q, m)


def test_one_group_per_host_reads_the_saved_group_size_from_the_shards(tmp_path):
    check_resume(tmp_path, "easgd", 4, 2, 6, 3, by_host=True)  # hosts of 2 -> hosts of 3


def check_resume(tmp_path, inter, p, n, q, m, by_host=False):
    """Saved at p ranks in groups of n, resumed at q in groups of m (by host: hosts of that many ranks)."""
    def strategy(size):
        return lambda: Hierarchical(SyncAverage(), INTERS[inter](), ranks_per_group=None if by_host else size)

    shards, w0, models, opts, manifest, directory = saved_run(tmp_path, strategy(n), p, n if by_host else None)
    saved = [checkpoint.state_arrays(model, opt) for model, opt in zip(models, opts)]
    assert manifest["process_groups"] == [list(range(g, g + n)) for g in range(0, p, n)]
    resized = SimulatedCluster(q, ranks_per_host=m if by_host else None)
    new_models, new_opts = ranks_of(resized, strategy(m), w0, 50.0)  # other weights: the restore sets them
    resized.run(lambda r: checkpoint.restore(directory, manifest, new_models[r], new_opts[r], new_opts[r].comm))
    old, new = roles(models[0], opts[0]), roles(new_models[0], new_opts[0])
    # per-weight inter state (PeriodicAverage keeps none uncompressed), and weights that differ per saved group
    assert bool(old["weight"]) == (inter not in ("sync", "periodic"))
    if inter != "sync":
        assert any(not np.array_equal(saved[0][old["kernel"]], s[old["kernel"]]) for s in saved)
    assert bool(old["residuals"]) == inter.endswith("int8")
    assert all(np.any(saved[0][key]) for key in old["residuals"])
    expected = expected_states(saved, old, n, new, q, m)
    for r, (model, opt) in enumerate(zip(new_models, new_opts)):
        got = checkpoint.state_arrays(model, opt)
        assert sorted(got) == sorted(expected[r])
        for key, value in expected[r].items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"rank {r}, {key}")
    w = expected[0][new["kernel"]].ravel()
    slot = expected[0][keys_of(new_models[0], new_opts[0])[id(new_opts[0].variables[-1])]].ravel()  # momentum
    least_squares.train(resized, new_models, new_opts, shards[:q], 1, BATCH, STEPS)  # step 6 synchronises
    if inter == "sync" or q // m == 1:  # one flat mean of the gradients over the q ranks, to float tolerance
        grads = [ref.grad(w, *ref.batch(shard, STEPS, BATCH)) for shard in shards[:q]]
        expected_w, _ = momentum_step(w, slot, np.mean(grads, axis=0))
        for model in new_models:
            np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), expected_w, rtol=1e-5)
    else:  # a synchronisation: each new group's ranks agree, and it trains on
        for g in range(0, q, m):
            for r in range(g + 1, g + m):
                np.testing.assert_array_equal(new_models[g].get_weights()[0], new_models[r].get_weights()[0])
        assert all(np.all(np.isfinite(model.get_weights()[0])) for model in new_models)


def test_what_does_not_pair_up_is_refused_in_one_line(tmp_path):
    # EASGD's state resumed as DiLoCo's (a config compare refuses it first in train.py); non-consecutive groups
    _, w0, _, _, manifest, directory = saved_run(tmp_path, lambda: Hierarchical(
        SyncAverage(), EASGD(TAU), ranks_per_group=2), 4)
    resized = SimulatedCluster(2)
    models, opts = ranks_of(resized, lambda: Hierarchical(SyncAverage(), DiLoCo(TAU), ranks_per_group=1), w0, 0.0)
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.restore(directory, manifest, models[0], opts[0], opts[0].comm)
    assert str(raised.value).startswith("the saved strategy state does not fit this run's layout: the saved inter "
                                        "state (") and "\n" not in str(raised.value)
    with pytest.raises(regroup.LayoutMismatch, match=r"^the saved shard layouts \[\[2, 1, 3, 6\], \[2, 0, 3, 6\]\] "
                                                     r"are not groups of 2 consecutive ranks over 6 elements$"):
        regroup.in_this_layout([[]] * 2, [[2, 1, 3, 6], [2, 0, 3, 6]], [], [(6, 1)], np.float32)


def test_another_ranks_per_group_fits_a_checkpoint_that_names_its_groups_only():
    strategy = Hierarchical(SyncAverage(), EASGD(TAU), ranks_per_group=1)
    manifest = {"num_ranks": 4, "config": {"strategy": "hierarchical", "ranks_per_group": 2}}
    config = {"strategy": "hierarchical", "ranks_per_group": 1}
    assert config_compare.resume_mismatches(manifest, config, 4, strategy) == ["ranks_per_group"]  # older: no groups
    manifest["process_groups"] = [[0, 1], [2, 3]]
    assert config_compare.resume_mismatches(manifest, config, 4, strategy) == []
    assert config_compare.resume_mismatches(manifest, config, 2, strategy) == []


def test_whole_values_join_a_groups_shards_and_split_into_the_variables_again():
    # two variables, (3, 2) and (2,): N = 8, cut in groups of 3: m = 3 and one padding zero; between two
    # per-weight states a counter (int64) and a learning rate (float32 scalar) that are no weight
    shapes, rng = [(3, 2), (2,)], np.random.default_rng(5)
    wholes = [rng.standard_normal(8).astype(np.float32) for _ in range(2)]  # saved group 0's two states
    counter, rate = np.int64(7), np.float32(0.1)

    def shard(whole, j):
        return np.concatenate([whole, [0.0]]).astype(np.float32)[3 * j:3 * j + 3]

    sharded = [[shard(wholes[0], j), counter, rate, shard(wholes[1], j)] for j in range(3)]
    layouts = [[3, j, 3, 8] for j in range(3)]
    assert regroup.segments(sharded[0], shapes, np.float32, 3) == [(regroup.SHARD, 1), (regroup.OTHER, 1),
                                                                   (regroup.OTHER, 1), (regroup.SHARD, 1)]
    per_weight = [np.zeros(s, np.float32) for s in shapes] + [counter, rate] + [np.zeros(s, np.float32)
                                                                               for s in shapes]
    got = regroup.in_this_layout(sharded, layouts, per_weight, shapes, np.float32)  # -> one variable per weight
    for state in got:
        assert len(state) == 6 and state[2] == counter and state[3] == rate
        np.testing.assert_array_equal(state[0], wholes[0][:6].reshape(3, 2))
        np.testing.assert_array_equal(state[1], wholes[0][6:])
        np.testing.assert_array_equal(state[5], wholes[1][6:])
    back = regroup.in_this_layout(got[:1], None, sharded[0], shapes, np.float32, shard=3)  # -> whole, to re-cut
    assert len(back[0]) == 4
    np.testing.assert_array_equal(back[0][0], wholes[0])
    np.testing.assert_array_equal(back[0][3], wholes[1])
    with pytest.raises(regroup.LayoutMismatch, match=r"^the saved inter state \(shard×2, other, other\) does "
                                                     r"not pair up with this run's \(shard×1, other, other, shard×1\)$"):
        regroup.in_this_layout([per_weight[:2] + per_weight[2:4]], None, sharded[0], shapes, np.float32, shard=3)


def test_an_accumulation_around_hierarchical_hands_it_its_part_and_sums_its_open_window(tmp_path):
    # GradientAccumulation(2, Hierarchical(...)): 5 micro-batches, a window open; 2 x 2 -> 2 x 1
    def strategy(n):
        return lambda: GradientAccumulation(2, strategy=Hierarchical(SyncAverage(), EASGD(TAU), ranks_per_group=n))

    _, w0, models, opts, manifest, directory = saved_run(tmp_path, strategy(2), 4)
    saved = [checkpoint.state_arrays(model, opt) for model, opt in zip(models, opts)]
    resized = SimulatedCluster(2)
    new_models, new_opts = ranks_of(resized, strategy(1), w0, 50.0)
    resized.run(lambda r: checkpoint.restore(directory, manifest, new_models[r], new_opts[r], new_opts[r].comm))
    old, window = keys_of(models[0], opts[0]), opts[0].strategy.accumulators[0]
    assert all(np.any(s[old[id(window)]]) for s in saved)
    center = np.concatenate([saved[j][old[id(opts[0].strategy.strategy.inter.center[0])]] for j in range(2)])
    for r, (model, opt) in enumerate(zip(new_models, new_opts)):
        got, new = checkpoint.state_arrays(model, opt), keys_of(model, opt)
        total = np.sum([s[old[id(window)]] for s in saved], axis=0, dtype=np.float64).astype(np.float32)
        np.testing.assert_array_equal(got[new[id(opt.strategy.accumulators[0])]], total if r == 0 else np.zeros_like(total))
        np.testing.assert_array_equal(got[new[id(opt.strategy.strategy.inter.center[0])]], center.reshape(-1, 1))
        np.testing.assert_array_equal(model.layers[0].kernel.numpy(), center.reshape(-1, 1))
