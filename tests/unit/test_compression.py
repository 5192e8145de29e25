"""The compression formats, the quantised allreduce and every strategy × format, on
p simulated ranks, against the NumPy references of tests/reference.py (issue 24, section B)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, PeriodicAverage, SyncAverage, resize
from hvd_easgd.app import cli, errors
from hvd_easgd.comm import Compression, SimulatedCluster
from hvd_easgd.strategies.local_updates import allreduce_unless_non_finite
from tests import least_squares, reference as ref
from tests.least_squares import least_squares_ranks

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # many simulated ranks, seconds together
QUANTISING = ("bf16", "int8", "int4", "sign")
BATCH = 4


def assert_reference(got, expected, name):
    """``ref.equals_quantised_reference`` (the ranks still agree bit for bit: they decode the same bytes)."""
    assert ref.equals_quantised_reference(got, expected, name), np.max(np.abs(got - expected))


def random_payload(seed, shape):
    """Values of several magnitudes, an outlier and a block of zeros: what a scale must survive."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0], size=shape)).astype(np.float32)
    flat = x.reshape(-1)
    flat[3] = 500.0
    flat[256:512] = 0.0
    return x


# --- the formats -----------------------------------------------------------------------------
def test_sign_sends_each_sign_and_its_block_s_mean_magnitude():
    fmt = Compression.sign
    x = np.concatenate([random_payload(0, (3000,)), np.zeros(2048, np.float32)])  # a block of zeros last
    blocks = 3  # 5048 elements: 2 full blocks, 952 of the third, padded with zeros
    padded = tf.reshape(tf.pad(tf.constant(x), [[0, blocks * 2048 - x.size]]), [blocks, 2048])
    data = fmt.encode(padded)
    assert data.dtype == tf.uint8 and data.shape == [blocks * (2048 // 8 + 4)]  # 1 bit an element, a scale a block
    decoded = tf.reshape(fmt.decode(data, blocks), [-1])[:x.size].numpy()
    assert np.array_equal(np.sign(decoded[:3000]), np.where(x[:3000] >= 0, 1.0, -1.0))  # every sign, zero as +
    assert_reference(decoded, ref.quantise_reference(x, "sign"), "sign")
    assert np.all(decoded[4096:] == 0)  # the block of zeros: scale 0, no NaN
    assert fmt.block_bytes / fmt.block_size <= Compression.int4.block_bytes / Compression.int4.block_size / 4


@pytest.mark.parametrize("name", ("bf16", "int8", "int4"))
def test_each_format_decodes_to_its_numpy_reference_bit_for_bit(name):
    fmt = Compression.by_name(name)
    x = random_payload(0, (1000,))
    blocks = -(-1000 // fmt.block_size)
    padded = tf.reshape(tf.pad(tf.constant(x), [[0, blocks * fmt.block_size - 1000]]), [blocks, fmt.block_size])
    data = fmt.encode(padded)
    assert data.dtype == tf.uint8 and data.shape == [blocks * fmt.block_bytes]  # scales included
    decoded = tf.reshape(fmt.decode(data, blocks), [-1])[:1000].numpy()
    expected = ref.quantise_reference(x, name)
    assert np.array_equal(decoded, expected)
    assert np.all(decoded[256:512] == 0)  # a block of zeros: scale 0, codes 0, no NaN
    if name != "bf16":  # at most half a step of its block's scale from the value
        step = np.abs(x[:768].reshape(3, 256)).max(axis=1) / ref.LEVELS[name]
        assert np.all(np.abs(decoded[:768] - x[:768]).reshape(3, 256) <= step[:, None] / 2 * (1 + 1e-6))


def test_each_format_says_what_it_costs_and_whether_it_sums():
    assert [(f.name, f.summable) for f in (Compression.none, Compression.fp16, Compression.bf16, Compression.int8,
                                           Compression.int4, Compression.sign)] == [
        ("none", True), ("fp16", True), ("bf16", False), ("int8", False), ("int4", False), ("sign", False)]
    assert (Compression.sign.block_size, Compression.sign.block_bytes) == (2048, 256 + 4)
    assert (Compression.int8.block_size, Compression.int8.block_bytes) == (256, 256 + 4)
    assert (Compression.int4.block_size, Compression.int4.block_bytes) == (256, 128 + 4)
    assert (Compression.bf16.block_size, Compression.bf16.block_bytes) == (1, 2)
    assert Compression.fp16.wire_itemsize(tf.float32) == 2 and Compression.none.wire_itemsize(tf.float32) == 4
    with pytest.raises(ValueError, match=r"^`compression` must be one of \['none', 'fp16', 'bf16', 'int8', 'int4', "
                                         r"'sign', 'powersgd', 'topk'\]\. Received: compression='int2'$"):
        Compression.by_name("int2")


def test_compression_md_s_sign_byte_table_is_the_formula():
    # docs/compression.md types the bytes a rank sends per synchronisation of the language model's 141,312
    # parameters and the flag at p = 2, 8 and 64: held here to the formula the account follows.
    from hvd_easgd.strategies.base import allreduce_traffic
    from tests.helpers import ROOT

    with open(f"{ROOT}/docs/compression.md") as f:
        page = f.read()
    table = page[page.index("| p | sign | int4 | sign ÷ int4 |"):]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")][:3]
    assert len(rows) == 3
    for row in rows:
        p, sign_bytes, int4_bytes, ratio = (float(cell.replace(",", "")) for cell in row.strip("|").split("|"))
        expected = [allreduce_traffic([tf.zeros([141312])], int(p), fmt, exact_values=1).wire_bytes
                    for fmt in (Compression.sign, Compression.int4)]
        assert (sign_bytes, int4_bytes) == tuple(round(b) for b in expected), row
        assert ratio == round(expected[0] / expected[1], 3), row


# --- the quantised allreduce -------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("name", QUANTISING)
def test_the_quantised_allreduce_matches_its_reference_on_every_rank_with_its_exact_account(p, name):
    fmt = Compression.by_name(name)
    cluster = SimulatedCluster(p)
    inputs = [[random_payload(10 + r, (37, 11)), random_payload(20 + r, (5,)), np.array([r + 1.0], np.float32)]
              for r in range(p)]
    for op in ("sum", "average"):
        for comm in cluster.communicators:
            comm.reset_account()
        out = cluster.run(lambda r: cluster.communicators[r].allreduce_with_errors(
            [tf.constant(t) for t in inputs[r]], op=op, compression=fmt))
        flat = [np.concatenate([t[0].ravel(), t[1]]) for t in inputs]
        expected = ref.quantised_allreduce_reference(flat, name)
        if op == "average":
            expected = expected / np.float32(p)
        firsts = None
        for reduced, errors in out:
            got = np.concatenate([reduced[0].numpy().ravel(), reduced[1].numpy()])
            assert_reference(got, expected, name)
            firsts = got if firsts is None else firsts
            assert np.array_equal(got, firsts)  # every rank's bits the same
            # the one-element tensor travels exact: 1 + 2 + ... + p
            assert reduced[2].numpy().tolist() == [p * (p + 1) / 2 / (p if op == "average" else 1)]
        for r, (_, errors) in enumerate(out):
            err = np.concatenate([errors[0].numpy().ravel(), errors[1].numpy()])
            assert_reference(err, flat[r] - ref.quantise_reference(flat[r], name), name)
            assert errors[2].numpy().tolist() == [0.0]
        message = ref.quantised_message_bytes(37 * 11 + 5, 1, name, p)
        by_formula = ({"bytes": message, "calls": 1, "wire_bytes": (p - 1) * message} if p == 2 else  # allgather
                      {"bytes": (p + 1) * message, "calls": 2, "wire_bytes": 2 * (p - 1) * message})  # a2a + ag
        assert [c.account(wire=True) for c in cluster.communicators] == [by_formula] * p


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("name", QUANTISING)
def test_a_payload_of_single_values_only_travels_exact(p, name):
    # A DiLoCo fragment holding only a scalar bias (and the non-finite flag): nothing to encode.
    cluster = SimulatedCluster(p)
    out = cluster.run(lambda r: cluster.communicators[r].allreduce_with_errors(
        [tf.constant([r + 0.5]), tf.constant([[2.0 * r]])], op="sum", compression=Compression.by_name(name)))
    for reduced, errors in out:
        assert [t.numpy().tolist() for t in reduced] == [[p * p / 2], [[float(p * (p - 1))]]]
        assert [t.numpy().tolist() for t in errors] == [[0.0], [[0.0]]]
    message = ref.quantised_message_bytes(0, 2, name, 2)  # one allgather of the 2 exact values, at any p
    assert [c.account(wire=True) for c in cluster.communicators] == \
        [{"bytes": message, "calls": 1, "wire_bytes": (p - 1) * message}] * p


def test_wire_bytes_follow_each_collectives_formula_at_p_3():
    cluster = SimulatedCluster(3)

    def collectives(rank):
        comm = cluster.communicators[rank]
        comm.allreduce([tf.ones(3)])  # 12 bytes: 2(p-1)/p * 12 = 16 on the wire
        comm.allgather(tf.ones(3))  # (p-1) * 12 = 24
        comm.broadcast([tf.ones(3)])  # (p-1)/p * 12 = 8
        comm.allreduce([tf.ones(3)], compression=Compression.fp16)  # 6 bytes: 8 on the wire

    cluster.run(collectives)
    assert [c.account(wire=True) for c in cluster.communicators] == [
        {"bytes": 12 + 12 + 12 + 6, "calls": 4, "wire_bytes": 16 + 24 + 8 + 8}] * 3
    assert cluster.communicators[0].account() == {"bytes": 42, "calls": 4}  # the figures as they were


def test_non_finite_values_are_caught_before_they_are_quantised():
    cluster = SimulatedCluster(3)
    inputs = [random_payload(r, (300,)) for r in range(3)]
    inputs[1][7] = np.inf  # would make its block's scale Inf and every code of it NaN

    def reduce(rank):
        return allreduce_unless_non_finite(cluster.communicators[rank], [tf.constant(inputs[rank])],
                                           Compression.int8)

    for sums, bad_ranks in cluster.run(reduce):
        assert bad_ranks.numpy() == 1.0  # exact, in the same call
        expected = ref.quantised_allreduce_reference([inputs[0], np.zeros(300, np.float32), inputs[2]], "int8")
        assert np.array_equal(sums[0].numpy(), expected)


# --- every strategy × format, with error feedback, against NumPy ---------------------------------


def train(cluster, models, opts, shards, steps, start=0):
    least_squares.train(cluster, models, opts, shards, steps, BATCH, start)


def assert_close(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5, (got, expected)


def compressed_reference(kind, name, shards, w0, steps, tau=2, lr=0.1, alpha=0.3):
    """Every rank's weights after ``steps`` (plain SGD inside), the payload compressed by ``name``,
    with error feedback e_i ← u_i − Q(u_i) for the quantising formats (EASGD: x_i loses Q(d_i))."""
    p = len(shards)
    feedback = name in QUANTISING
    xs = [w0.copy() for _ in range(p)]
    residuals = [np.zeros_like(w0) for _ in range(p)]
    held = w0.copy()  # DiLoCo's θ, PeriodicAverage's x̄, EASGD's center
    outer = ref.SGDRef(0.7, 0.7, nesterov=True)
    for step in range(steps):
        grads = [ref.grad(xs[i], *ref.batch(shards[i], step, BATCH)) for i in range(p)]
        if kind == "sync":
            payloads = [g + e for g, e in zip(grads, residuals)] if feedback else grads
            g = ref.quantised_allreduce_reference(payloads, name) / p
            residuals = [u - ref.quantise_reference(u, name) for u in payloads] if feedback else residuals
            xs = [x - lr * g for x in xs]
            continue
        xs = [x - lr * g for x, g in zip(xs, grads)]
        if (step + 1) % tau:
            continue
        if kind == "easgd":
            diffs = [alpha * (x - held) for x in xs]
            held = held + ref.quantised_allreduce_reference(diffs, name)
            xs = [x - ref.quantise_reference(d, name) for x, d in zip(xs, diffs)]
            continue
        deltas = [held - x for x in xs] if kind == "diloco" else [x - held for x in xs]
        payloads = [d + e for d, e in zip(deltas, residuals)] if feedback else deltas
        mean = ref.quantised_allreduce_reference(payloads, name) / p
        residuals = [u - ref.quantise_reference(u, name) for u in payloads] if feedback else residuals
        held = outer.step(held, mean) if kind == "diloco" else held + mean
        xs = [held.copy() for _ in range(p)]
    return xs


STRATEGIES = {
    "sync": lambda name: SyncAverage(compression=name),
    "easgd": lambda name: EASGD(period=2, moving_rate=0.3, compression=name),
    "periodic": lambda name: PeriodicAverage(period=2, compression=name),
    "diloco": lambda name: DiLoCo(period=2, compression=name),
}


@pytest.mark.parametrize("name", ("fp16",) + QUANTISING)
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_every_strategy_sends_its_payload_compressed_as_the_reference_does(kind, name):
    if kind == "sync" and name == "fp16":
        pytest.skip("SyncAverage's fp16 path is --fp16-allreduce's, tested in test_strategies_local.py")
    if kind == "sync" and name == "sign":
        with pytest.raises(ValueError, match="sign"):  # no residual there: refused (test below)
            STRATEGIES[kind](name)
        return
    p, steps = 3, 7  # tau = 2: three synchronisations with error feedback, and one local step after
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = least_squares_ranks(cluster, lambda: STRATEGIES[kind](name), lambda: keras.optimizers.SGD(0.1),
                                       w0)
    train(cluster, models, opts, shards, steps)
    expected = compressed_reference(kind, name, shards, w0, steps)
    for model, w in zip(models, expected):
        assert_close(model.layers[0].kernel.numpy().ravel(), w)
    # the account: what expected_traffic says, per step, and by hand
    strategy = opts[0].strategy
    traffic = strategy.expected_traffic(models[0].trainable_variables, hosts=1, ranks_per_host=p).total
    syncs = steps if kind == "sync" else steps // 2
    if name == "fp16":
        by_hand = (2 * (ref.DIM + 1), 1, 2 * (ref.DIM + 1) * 4 / 3)  # the flag in fp16 too; ring 2(p-1)/p
    else:
        message = ref.quantised_message_bytes(ref.DIM, 1, name, p)  # the flag travels exact
        by_hand = ((p + 1) * message, 2, 2 * (p - 1) * message)
    per = 1 if kind == "sync" else 2  # expected_traffic averages a synchronisation over tau = 2 steps
    assert (traffic.bytes * per, traffic.calls * per, traffic.wire_bytes * per) == pytest.approx(by_hand, rel=1e-12)
    for comm in cluster.communicators:
        account = comm.account(wire=True)
        assert (account["bytes"], account["calls"], account["wire_bytes"]) == pytest.approx(
            tuple(syncs * v for v in by_hand), rel=1e-12)
    # the residuals are per-rank state, checkpointed with the strategy
    residuals = [v for v in strategy.state_variables() if "residual" in v.name]
    assert len(residuals) == (1 if name in QUANTISING and kind != "easgd" else 0)


def test_sync_average_skips_a_step_with_a_non_finite_gradient_on_any_rank_and_keeps_its_residuals():
    cluster = SimulatedCluster(3)
    variables = [tf.Variable(np.ones(6, np.float32)) for _ in range(3)]
    opts = [hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), SyncAverage(compression="int8"), comm=c)
            for c in cluster.communicators]
    grads = [np.linspace(-1, 1, 6).astype(np.float32) * (r + 1) for r in range(3)]
    cluster.run(lambda r: opts[r].apply([tf.constant(grads[r])], [variables[r]]))
    residual_after_one = [opts[r].strategy.error_feedback.residuals[0].numpy() for r in range(3)]
    bad = [g.copy() for g in grads]
    bad[2][0] = np.nan
    cluster.run(lambda r: opts[r].apply([tf.constant(bad[r])], [variables[r]]))
    for r in range(3):
        assert opts[r].strategy.skipped_steps.numpy() == 1
        assert np.array_equal(opts[r].strategy.error_feedback.residuals[0].numpy(), residual_after_one[r])
        assert np.array_equal(variables[r].numpy(), variables[0].numpy())


# --- refusals, options, state --------------------------------------------------------------------
def test_a_format_that_does_not_apply_is_refused_in_one_line():
    for make, kind in ((DiLoCo, "pseudo-gradients"), (EASGD, "elastic differences"),
                       (PeriodicAverage, "weight differences")):
        with pytest.raises(ValueError, match=rf"^`compression` must be a format that applies to {kind} \(what "
                                             r"--strategy \w+ sends\); powersgd applies to gradients only\. "
                                             r"Received: compression='powersgd'$"):
            make(compression="powersgd")
    assert SyncAverage(compression="powersgd").powersgd.rank == 4
    with pytest.raises(ValueError, match=r"^`powersgd_rank` must be an integer >= 1"):
        SyncAverage(compression="powersgd", powersgd_rank=0)


def test_the_command_line_option_reaches_the_strategy_or_hierarchicals_inter_strategy():
    config = cli.parse_args(["--strategy", "diloco", "--compression", "int4"])
    assert (config.compression, config.as_dict()["compression"]) == ("int4", "int4")
    assert cli.make_strategy(config).compression is Compression.int4
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "hierarchical", "--inter", "easgd",
                                                 "--compression", "int8"]))
    assert strategy.inter.compression is Compression.int8 and strategy.intra.compression is Compression.none
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "periodic", "--accumulate", "2",
                                                 "--compression", "bf16"]))
    assert strategy.strategy.compression is Compression.bf16  # GradientAccumulation's child holds it
    assert cli.make_strategy(cli.parse_args(["--fp16-allreduce"])).compression is Compression.fp16  # the alias
    with pytest.raises(errors.UsageError, match=r"^--fp16-allreduce is --compression fp16; give one of them\. "
                                                r"Received: --compression int8 --fp16-allreduce$"):
        cli.make_strategy(cli.parse_args(["--compression", "int8", "--fp16-allreduce"]))
    with pytest.raises(errors.UsageError, match=r"powersgd applies to gradients only"):
        cli.make_strategy(cli.parse_args(["--strategy", "diloco", "--compression", "powersgd"]))
    with pytest.raises(errors.UsageError, match=r"^--powersgd-rank must be > 0\. Received: --powersgd-rank=0$"):
        cli.parse_args(["--powersgd-rank", "0"])


def test_compressed_strategies_round_trip_their_config_and_restart_their_residuals_at_another_size():
    for strategy in (SyncAverage(compression="int8"), EASGD(compression="int4"), DiLoCo(compression="bf16"),
                     PeriodicAverage(compression="fp16")):
        again = type(strategy).from_config(strategy.get_config())
        assert again.compression is strategy.compression and again.get_config() == strategy.get_config()
    assert SyncAverage(compression="fp16").resize_refusal(2, 4) is None  # no residuals
    for strategy in (SyncAverage(compression="int8"), DiLoCo(compression="int4"), PeriodicAverage(compression="bf16")):
        assert strategy.resize_refusal(2, 4) is None
        weights = [tf.Variable(tf.ones([3, 2])), tf.Variable(tf.ones([2]))]
        strategy.build(weights)
        residuals = strategy.error_feedback.residuals
        rules = strategy.resize_rules()
        assert [rules[id(e)] for e in residuals] == [resize.RESTART_AT_ZERO] * 2, strategy
    assert EASGD(compression="int8").resize_refusal(2, 4) is None  # no residual: it lives in x_i - center
    assert "compression" not in DiLoCo().get_config()  # an uncompressed config as it was
