"""An Embedding's sparse gradient (tf.IndexedSlices) on every strategy path, at p > 1.

``DistributedOptimizer.apply`` turns each gradient into a dense tensor of its variable's shape with
strategies/base.py's ``as_dense`` (in ``gradient_sums``: slices scattered, duplicates summed) before the
strategy's step, and every strategy's step densifies what it is handed with ``as_dense`` again; so every
collective path (Horovod over Gloo or MPI, the mpi-direct ops, SimulatedCluster here) only ever sees
dense tensors, of the same shapes on every rank whatever ids a rank looked up. This module checks it on
simulated ranks that each look up their own ids: each path's weights equal a NumPy reference run on the
same gradients densified by hand (np.add.at), and the sync path's byte account is the dense payload's.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, GradientAccumulation, Hierarchical, PeriodicAverage, SyncAverage
from hvd_easgd.comm import SimulatedCluster
from tests import reference as ref

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # many simulated ranks, seconds together

V, D, K = 10, 3, 2  # vocabulary, embedding width, outputs of the Dense layer on top
EMBEDDING = V * D
N = EMBEDDING + D * K  # the trainable elements, flattened in variable order (embeddings, then the kernel)
LR, TAU, ALPHA = 0.1, 2, 0.25
STEPS = 3  # τ = 2: a synchronisation at t = 2, and a local step after it so that the ranks differ at the end
# Rank r's ids: rank 0 repeats row 1; row 6 is rank 1's alone, 3 rank 2's (which repeats 8), 2 and 7 rank 3's;
# every rank looks up row 4 and no rank rows 0, 5, 9. The lengths differ: only dense tensors can meet in one
# collective (SimulatedCluster refuses a collective whose shapes differ between ranks).
IDS = ([1, 4, 1], [4, 6], [4, 8, 3, 8], [2, 4, 7])
COUNTS = (2, 1, 3, 5)  # samples per rank, where a path passes sample_count
X0 = np.random.default_rng(0).standard_normal(N).astype(np.float32)
WHOLE = np.ones(N, bool)
EMBEDDING_ONLY = np.arange(N) < EMBEDDING


# --- p ranks, each training its own copy of the model on its own ids --------------------------------
def ranks_with(p, make_strategy):
    """p simulated ranks, each an Embedding(V, D) then a Dense(K, no bias) starting from X0, SGD(LR) and
    its own strategy; the accounts are reset after the initial broadcast."""
    cluster = SimulatedCluster(p)
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(V, D),
                                  keras.layers.Dense(K, use_bias=False)])
        model.set_weights([X0[:EMBEDDING].reshape(V, D), X0[EMBEDDING:].reshape(D, K)])
        strategy = make_strategy().bind(comm)  # in the main thread: a simulated split needs no collective
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return cluster, models, opts


def train(cluster, models, opts, steps, counts=None):
    """``steps`` steps on every rank; returns what the ranks fed, densified by hand: (steps, p, N)."""
    def one(rank, step):
        model = models[rank]
        # A gradient of its own per rank and step: the embedding's rows get targets @ kernelᵀ at each id.
        targets = np.random.default_rng([rank, step]).standard_normal((1, len(IDS[rank]), K)).astype(np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.constant([IDS[rank]])) * targets)
        slices, kernel = tape.gradient(loss, model.trainable_variables)
        assert isinstance(slices, tf.IndexedSlices)  # what reaches the optimizer is sparse
        opts[rank].apply([slices, kernel], model.trainable_variables,
                         sample_count=None if counts is None else counts[rank])
        dense = ref.densified(slices.indices.numpy(), slices.values.numpy(), V)
        return np.concatenate([dense.ravel(), kernel.numpy().ravel()])

    return np.stack([cluster.run(lambda r: one(r, step)) for step in range(steps)])


def weights(models):
    """Every rank's trainable weights, flattened as the references hold them: (p, N)."""
    return np.stack([np.concatenate([v.numpy().ravel() for v in m.trainable_variables]) for m in models])


def changed_rows(models, rank):
    """The embedding rows of rank ``rank`` that moved from X0."""
    embeddings = models[rank].trainable_variables[0].numpy()
    return set(np.flatnonzero(np.any(embeddings != X0[:EMBEDDING].reshape(V, D), axis=1)).tolist())


# --- SyncAverage: none, fp16, bf16 -------------------------------------------------------------------
def sync_reference(fed, counts, name):
    """SyncAverage with counts, in float32 as it computes: w ← w − lr·Σ_r Q(S_r + e_r) / Σ_r n_r with
    S_r = n_r·g_r, summed in rank order in the wire format (ref.quantised_allreduce_reference: fp16 adds
    in fp16); e_r is bf16's error feedback, u_r − bf16(u_r) (none and fp16 keep no residual)."""
    w, residuals = X0.copy(), np.zeros((len(counts), N), np.float32)
    for grads in fed:
        payloads = np.float32(counts)[:, None] * grads + residuals
        if name == "bf16":
            residuals = payloads - np.stack([ref.quantise_reference(u, name) for u in payloads])
        total = ref.quantised_allreduce_reference(list(payloads), name)
        w = w - total / np.float32(sum(counts)) * np.float32(LR)
    return w


def dense_step_bytes(name, p):
    """One step's payload per rank, by hand: every element of both variables, embedding rows no rank looked
    up included, plus the sample count (4 bytes fp32, 2 fp16); bf16 goes through the quantised allreduce,
    2 bytes an element with the flag and the count exact, alltoall and allgather from p = 3 on."""
    if name == "none":
        return 4 * (N + 1)
    if name == "fp16":
        return 2 * (N + 1)
    messages = p + 1 if p > 2 else 1  # p chunks in the alltoall, one in the allgather; else one allgather
    return messages * ref.quantised_message_bytes(N, 2, "bf16", p)


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("name", ["none", "fp16", "bf16"])
def test_sync_average_applies_the_mean_of_the_densified_gradients_and_sends_them_dense(name, p):
    cluster, models, opts = ranks_with(p, lambda: SyncAverage(compression=name))
    fed = train(cluster, models, opts, STEPS, COUNTS[:p])
    expected = sync_reference(fed, COUNTS[:p], name)
    for got in weights(models):  # bit for bit: the reference takes the same float32 steps
        np.testing.assert_array_equal(got, expected)
    assert changed_rows(models, 0) == set().union(*IDS[:p])  # rows no rank looked up keep their values
    traffic = opts[0].strategy.expected_traffic(models[0].trainable_variables, ranks_per_host=p, sample_counts=True)
    for comm in cluster.communicators:
        assert comm.account()["bytes"] == STEPS * dense_step_bytes(name, p) == STEPS * traffic.total.bytes


# --- SyncAverage under PowerSGD ----------------------------------------------------------------------
def powersgd_reference(fed, counts, q):
    """One exact warm-up step, then the embedding (10 × 3, rate 30/13 >= 2 at R = 1) as rank-1 factors
    (ref.powersgd_step, warm-started from Q); the kernel (3 × 2, rate 1.2) travels whole."""
    w, residuals = X0.astype(np.float64), [np.zeros((V, D))] * len(counts)
    for t, grads in enumerate(fed):
        sums = np.float64(counts)[:, None] * grads
        total = sums.sum(axis=0)
        if t >= 1:
            approximate, residuals, q = ref.powersgd_step([s[:EMBEDDING].reshape(V, D) for s in sums], residuals, q)
            total[:EMBEDDING] = approximate.ravel()
        w = w - LR * total / sum(counts)
    return w


@pytest.mark.parametrize("p", [2, 3])
def test_powersgd_compresses_the_densified_embedding_and_leaves_unseen_rows_alone(p):
    cluster, models, opts = ranks_with(p, lambda: SyncAverage(compression="powersgd", powersgd_rank=1,
                                                              powersgd_warmup_steps=1))
    powersgd = opts[0].strategy.powersgd
    assert sorted(powersgd.residuals) == [0]  # the embedding alone is compressed
    q = powersgd.factors[0].numpy().astype(np.float64)  # Q before any step: the warm-up leaves it alone
    fed = train(cluster, models, opts, STEPS, COUNTS[:p])
    got = weights(models)
    np.testing.assert_allclose(got, np.tile(powersgd_reference(fed, COUNTS[:p], q), (p, 1)), rtol=1e-5, atol=1e-6)
    # A row no rank looked up is a zero row of every M_r, hence of P̂ and of the applied P̂ Qᵀ: exactly unchanged.
    assert changed_rows(models, 0) == set().union(*IDS[:p])
    exact = sync_reference(fed, COUNTS[:p], "none")
    assert not np.allclose(got[0, :EMBEDDING], exact[:EMBEDDING], rtol=1e-3)  # it did compress
    # per rank: the warm-up's dense step, then per step P (13 × 1) with the kernel and the count, then Q (3 × 1)
    compressed_step = 4 * (V * 1 + D * K + 1) + 4 * (D * 1)
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 4 * (N + 1) + (STEPS - 1) * compressed_step, "calls": 1 + 2 * (STEPS - 1)}


# --- GradientAccumulation(k=2) over SyncAverage ------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3])
def test_accumulation_applies_the_mean_of_the_densified_micro_batches(p):
    k, windows = 2, 2
    cluster, models, opts = ranks_with(p, lambda: GradientAccumulation(k))
    fed = train(cluster, models, opts, k * windows)
    expected = X0.copy()
    for window in fed.reshape(windows, k, p, N):
        per_rank = sum(window)  # each rank's accumulator: 0 + g_1 + g_2, in float32
        expected = expected - sum(per_rank) / np.float32(k * p) * np.float32(LR)  # the count k per rank rides along
    for got in weights(models):
        np.testing.assert_array_equal(got, expected)
    for comm in cluster.communicators:  # one dense allreduce (and the window's count) per window
        assert comm.account() == {"bytes": windows * 4 * (N + 1), "calls": windows}


# --- EASGD, PeriodicAverage, DiLoCo: local steps, then a synchronisation every τ steps ----------------
def flat_reference(inter):
    """ref.hierarchical_reference with one rank per group: the inter rule alone, as the flat strategy runs it
    (EASGD's elastic step, PeriodicAverage's mean) on the fed gradients."""
    def reference(fed):
        p = fed.shape[1]
        return ref.hierarchical_reference(fed, [1] * p, [[r] for r in range(p)], LR, X0, inter, tau=TAU,
                                          alpha=ALPHA)
    return reference


def diloco_reference(masks, name="none"):
    """DiLoCo's blocking rule on the fed gradients: ref.DiLoCoOverlapReference's merge at δ = 0 (the outer
    Nesterov SGD(0.7, 0.7) per fragment, int8's quantised mean and residuals), fragment f at t ≡ ⌊fτ/F⌋."""
    def reference(fed):
        diloco = ref.DiLoCoOverlapReference([None] * fed.shape[1], X0, masks, TAU, delta=0, name=name, lr=LR)
        # In float32, as the ranks step: at p = 2 one int8 payload element sits an ulp from a rounding tie
        # (u/s = 16.499994 on the ranks, 16.500023 from float64 weights) and must get the ranks' code.
        diloco.xs, diloco.theta = [x.astype(np.float32) for x in diloco.xs], diloco.theta.astype(np.float32)
        diloco.residuals = [e.astype(np.float32) for e in diloco.residuals]
        for t, grads in enumerate(fed, start=1):
            diloco.xs = [diloco.inner.step(x, g) for x, g in zip(diloco.xs, grads)]
            for f, mask in enumerate(masks):
                if t % TAU == diloco.offset(f):
                    diloco.pending = (f, t, [diloco.theta[mask] - x[mask] + e[mask]
                                             for x, e in zip(diloco.xs, diloco.residuals)],
                                      [x[mask].copy() for x in diloco.xs])
                    diloco.merge()
        return diloco.xs, diloco.theta
    return reference


LOCAL_PATHS = {
    "easgd": (lambda: EASGD(period=TAU, moving_rate=ALPHA), flat_reference("easgd")),
    "periodic": (lambda: PeriodicAverage(period=TAU), flat_reference("periodic")),
    "diloco": (lambda: DiLoCo(period=TAU), diloco_reference([WHOLE])),
    # fragment_layout: the embedding (30 elements) to fragment 0, then the kernel to the lighter fragment 1
    "diloco_fragments": (lambda: DiLoCo(period=TAU, fragments=2),
                         diloco_reference([EMBEDDING_ONLY, ~EMBEDDING_ONLY])),
    "diloco_int8": (lambda: DiLoCo(period=TAU, compression="int8"), diloco_reference([WHOLE], "int8")),
}


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("path", sorted(LOCAL_PATHS))
def test_local_step_strategies_match_their_reference_on_the_densified_gradients(path, p):
    make_strategy, reference = LOCAL_PATHS[path]
    cluster, models, opts = ranks_with(p, make_strategy)
    fed = train(cluster, models, opts, STEPS)
    xs, kept = reference(fed)
    got = weights(models)
    np.testing.assert_allclose(got, np.stack(xs), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got[0], got[1])  # each rank stepped on its own slices since the last synchronisation
    if kept is not None:  # EASGD's center, DiLoCo's θ: the same on every rank
        for opt in opts:
            center = np.concatenate([v.numpy().ravel() for v in opt.strategy.kept_variables()])
            np.testing.assert_allclose(center, kept, rtol=1e-5, atol=1e-6)
    if path == "diloco_fragments":
        assert opts[0].strategy.fragment_indices == [[0], [1]]  # the masks above


# --- Hierarchical: two groups of two ------------------------------------------------------------------
@pytest.mark.parametrize("inter", ["sync", "easgd"])
def test_hierarchical_reduce_scatters_the_densified_gradients_in_two_groups(inter):
    make_inter = {"sync": SyncAverage, "easgd": lambda: EASGD(period=TAU, moving_rate=ALPHA)}[inter]
    groups = [[0, 1], [2, 3]]
    cluster, models, opts = ranks_with(4, lambda: Hierarchical(SyncAverage(), make_inter(), ranks_per_group=2))
    fed = train(cluster, models, opts, STEPS, COUNTS)
    x, _ = ref.hierarchical_reference(fed, COUNTS, groups, LR, X0, inter, tau=TAU, alpha=ALPHA)
    got = weights(models)
    for group, expected in zip(groups, x):
        np.testing.assert_array_equal(got[group[0]], got[group[1]])  # bit-identical within a group
        np.testing.assert_allclose(got[group[0]], expected, rtol=1e-5, atol=1e-6)
    if inter == "easgd":
        assert not np.allclose(got[0], got[2])  # the groups stepped on their own slices
