"""The sparse payload (--compression topk, issue 62): its encoder and bytes against the NumPy
reference of tests/reference.py, error feedback's conservation bit for bit, the sparse allreduce on
p = 2 and 3 simulated ranks with its exact account, DiLoCo and EASGD with it against NumPy, a
mid-period resume, the command line, and what the traffic hooks and the cost model say of it."""
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvd_easgd import DiLoCo, EASGD, PeriodicAverage, SyncAverage, checkpoint, resize
from hvd_easgd.choosing import cost_model
from hvd_easgd.app import cli, config_compare, errors
from hvd_easgd.comm import Compression, SimulatedCluster, sparse_allreduce
from hvd_easgd.comm.compression import TopKCompression, config_of
from hvd_easgd.strategies.base import Traffic, allreduce_traffic
from tests import least_squares, reference as ref
from tests.helpers import ROOT
from tests.least_squares import least_squares_ranks

pytestmark = pytest.mark.unit
# (density, bits): the default; an odd k over an odd number of chunks (the positions' padding) at 1
# bit; k = 3 at 4 bits; 8 bits at a fifth of each chunk.
FORMATS = [(1 / 64, 2), (0.01, 1), (3 / 4095, 4), (0.2, 8)]
ELEMENTS = 2 * 4095 + 1000  # three chunks, the last padded


def sparse_payload(seed, n=ELEMENTS):
    """Magnitudes from 1e-3 to 30 in chunk 0 and 2; chunk 1 is zeros but for ten values: ties, an
    element on a cell edge, ones below a quarter of a cell (not worth sending), a negative zero, and
    fewer non-zeros than k (so zeros fall among the top k)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0], size=n)).astype(np.float32)
    x[4095:8190] = 0.0
    x[4100:4110] = [8.0, -8.0, 8.0, 4.0, -2.0, 1.0, 0.5, 0.25, 0.24, -0.0]
    return x


def topk(density=1 / 64, bits=2):
    return Compression.by_name("topk", density=density, bits=bits)


# --- the encoder -------------------------------------------------------------------------------
@pytest.mark.parametrize("density, bits", FORMATS)
def test_the_encoder_writes_the_reference_bytes_and_decodes_to_the_reference(density, bits):
    fmt, x = topk(density, bits), sparse_payload(1)
    chunks = fmt.chunks(ELEMENTS)
    padded = tf.reshape(tf.pad(tf.constant(x), [[0, chunks * 4095 - ELEMENTS]]), [chunks, 4095])
    data = fmt.encode(padded)
    assert data.dtype == tf.uint8 and data.shape == [fmt.coded_bytes(chunks)]
    assert np.array_equal(data.numpy(), ref.topk_message(x, density, bits))
    decoded = tf.reshape(fmt.decode(data, chunks), [-1])[:ELEMENTS].numpy()
    expected = ref.topk_reference(x, density, bits)
    assert np.array_equal(decoded, expected)
    sent = decoded != 0
    assert np.all(np.pad(sent, (0, chunks * 4095 - ELEMENTS)).reshape(chunks, 4095).sum(axis=1) <= fmt.k)
    scales = np.abs(np.pad(x, (0, chunks * 4095 - ELEMENTS)).reshape(chunks, 4095)).max(axis=1)
    bound = np.repeat(scales * 2.0 ** -bits, 4095)[:ELEMENTS]
    assert np.all(np.abs(decoded - x)[sent] <= (bound + np.spacing(np.abs(x)))[sent])  # s·2^-B, and û's rounding
    assert np.all(np.sign(decoded[sent]) == np.sign(x[sent]))


def test_the_hand_worked_chunk():
    # Chunk 1 of the payload at 2 bits and k = 64: s = 8, cells of w = 4, units s/4 = 2: 8 -> 3·2 = 6
    # (ties to the lower position: all three 8s are kept), 4 (on the edge) -> 6, -2 -> -2, 1 -> 2
    # (a quarter of a cell: still within a factor 2), 0.5, 0.25, 0.24 -> not sent (below s/8 = 1).
    decoded = ref.topk_reference(sparse_payload(1), 1 / 64, 2)[4095:8190]
    assert decoded[5:15].tolist() == [6.0, -6.0, 6.0, 6.0, -2.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    assert not np.any(decoded[:5]) and not np.any(decoded[15:])


def test_the_bytes_follow_the_formula_and_on_the_language_model_a_tenth_of_int4s():
    for density, bits in FORMATS:
        fmt = topk(density, bits)
        for elements, exact in ((ELEMENTS, 1), (141312, 1), (6, 0), (4095, 2)):
            assert fmt.message_bytes(elements, exact) == ref.topk_message_bytes(elements, exact, density, bits)
    default = Compression.topk
    assert (default.density, default.bits, default.k) == (1 / 64, 2, 64)
    # 35 chunks, 2,240 slots: 3,360 position bytes, 560 code bytes, 140 scale bytes, the flag's 4
    assert default.message_bytes(141312, 1) == 3360 + 560 + 140 + 4 == 4064
    int4 = ref.quantised_message_bytes(141312, 1, "int4", 2)
    assert int4 == 72868 and 4064 / int4 < 0.06  # the goal: at most 1/4
    assert 4064 / (4 * (141312 + 1)) < 1 / 128


def _language_model_bytes_per_rank(p):
    """(topk, int4, fp32): the wire bytes a rank sends per synchronisation of the language model's 141,312
    parameters and the flag at ``p`` ranks, as the account counts them (``allreduce_traffic``)."""
    return tuple(allreduce_traffic([tf.zeros([141312])], p, fmt, exact_values=1).wire_bytes
                 for fmt in (Compression.topk, Compression.int4, Compression.none))


def _numbers(row):
    return [float(cell.replace(",", "")) for cell in row.strip("|").split("|")]


def test_the_pages_byte_tables_are_the_formulas():
    # compression.md's table and sparse_allreduce.py's docstring give the bytes each rank sends on the
    # language model at p = 2, 8 and 64: typed once, held here to the formula the account follows.
    with open(os.path.join(ROOT, "docs", "compression.md")) as f:
        page = f.read()
    table = page[page.index("| p | topk (D = 1/64, B = 2) | int4 | fp32 | topk ÷ int4 |"):]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")][:3]
    docstring = [line.split() for line in sparse_allreduce.__doc__.splitlines()
                 if re.fullmatch(r"\d+( +[\d,]+){5}", line.strip())]  # the table's rows: p and five byte counts
    assert [int(_numbers(row)[0]) for row in rows] == [int(line[0]) for line in docstring] == [2, 8, 64]
    for row, line in zip(rows, docstring):
        p, topk_bytes, int4_bytes, fp32_bytes, ratio = _numbers(row)
        expected = _language_model_bytes_per_rank(int(p))
        assert (topk_bytes, int4_bytes, fp32_bytes) == tuple(round(b) for b in expected), row
        assert ratio == round(expected[0] / expected[1], 2 if expected[0] / expected[1] >= 0.1 else 3), row
        chosen, int4_column, fp32_column = (float(line[i].replace(",", "")) for i in (1, 4, 5))
        assert (chosen, int4_column, fp32_column) == tuple(round(b) for b in expected), line


# --- the sparse allreduce ----------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3])
def test_the_sparse_allreduce_matches_its_reference_on_every_rank_with_its_exact_account(p):
    density, bits = 0.01, 2
    fmt, cluster = topk(density, bits), SimulatedCluster(p)
    inputs = [[sparse_payload(10 + r)[:7000].reshape(70, 100), sparse_payload(20 + r)[:5],
               np.array([r + 1.0], np.float32)] for r in range(p)]
    for r, v in enumerate((500.5, 1e8, -1e8)[:p]):  # a position every rank sends, each its chunk's largest:
        inputs[r][0][0, 0] = v  # sent as 375.375, 7.5e7, -7.5e7, whose sum depends on the order at p = 3
    flat = [np.concatenate([t[0].ravel(), t[1]]) for t in inputs]
    message = ref.topk_message_bytes(7005, 1, density, bits)
    for op in ("sum", "average"):
        for comm in cluster.communicators:
            comm.reset_account()
        out = cluster.run(lambda r: cluster.communicators[r].allreduce_with_errors(
            [tf.constant(t) for t in inputs[r]], op=op, compression=fmt))
        expected = ref.topk_allreduce_reference(flat, density, bits)
        assert p < 3 or expected[0] != ref.topk_allreduce_reference(flat[::-1], density, bits)[0]
        if op == "average":
            expected = expected / np.float32(p)
        for reduced, _ in out:  # the reference's bits, so every rank's are the same
            assert np.array_equal(np.concatenate([reduced[0].numpy().ravel(), reduced[1].numpy()]), expected)
            assert reduced[2].numpy().tolist() == [p * (p + 1) / 2 / (p if op == "average" else 1)]  # exact
        # Error feedback's conservation: what a rank sent plus what it keeps is its payload, bit for bit.
        for r, (_, errors) in enumerate(out):
            kept = np.concatenate([errors[0].numpy().ravel(), errors[1].numpy()])
            sent = ref.topk_reference(flat[r], density, bits)
            assert np.array_equal(sent + kept, flat[r]) and np.array_equal(kept, flat[r] - sent)
            assert np.array_equal(kept[sent == 0], flat[r][sent == 0])  # what was not sent is kept whole
            assert errors[2].numpy().tolist() == [0.0]
        by_formula = {"bytes": message, "calls": 1, "wire_bytes": (p - 1) * message}  # one allgather
        assert [c.account(wire=True) for c in cluster.communicators] == [by_formula] * p
    traffic = allreduce_traffic([tf.zeros([70, 100]), tf.zeros([5]), tf.zeros([1])], p, fmt)
    assert traffic == Traffic(message, 1, (p - 1) * message)
    assert traffic.by_collective == (("sparse_allgather", message, 1, (p - 1) * message),)


def test_a_non_finite_payload_is_caught_before_it_is_selected():
    from hvd_easgd.strategies.local_updates import allreduce_unless_non_finite
    cluster = SimulatedCluster(2)
    inputs = [sparse_payload(r)[:5000] for r in range(2)]
    inputs[1][7] = np.inf
    out = cluster.run(lambda r: allreduce_unless_non_finite(cluster.communicators[r], [tf.constant(inputs[r])],
                                                            topk()))
    for sums, bad_ranks in out:
        assert bad_ranks.numpy() == 1.0
        assert np.array_equal(sums[0].numpy(), ref.topk_allreduce_reference([inputs[0], np.zeros(5000)], 1 / 64, 2))


# --- DiLoCo and EASGD with it, against NumPy ---------------------------------------------------
K2 = (2 / 4095, 2)  # k = 2 of the model's 6 weights a synchronisation: the rest waits in the residual


def strategies_reference(kind, shards, w0, steps, tau=2, lr=0.1, alpha=0.3):
    """Every rank's weights: plain SGD inside; every tau steps DiLoCo sends top-k(Δ_i + e_i) and keeps
    e_i ← u_i − sent_i (its outer Nesterov SGD 0.7, 0.7 on the mean), EASGD sends top-k(α(x_i − x̃)) and
    x_i loses what it sent (no residual)."""
    p = len(shards)
    xs, held = [w0.copy() for _ in range(p)], w0.copy()
    residuals = [np.zeros_like(w0) for _ in range(p)]
    outer = ref.SGDRef(0.7, 0.7, nesterov=True)
    for step in range(steps):
        xs = [x - lr * ref.grad(x, *ref.batch(shards[i], step, 4)) for i, x in enumerate(xs)]
        if (step + 1) % tau:
            continue
        if kind == "easgd":
            diffs = [alpha * (x - held) for x in xs]
            held = held + ref.topk_allreduce_reference(diffs, *K2)
            xs = [x - ref.topk_reference(d, *K2) for x, d in zip(xs, diffs)]
            continue
        payloads = [held - x + e for x, e in zip(xs, residuals)]
        residuals = [u - ref.topk_reference(u, *K2) for u in payloads]
        held = outer.step(held, ref.topk_allreduce_reference(payloads, *K2) / p)
        xs = [held.copy() for _ in range(p)]
    return xs, residuals


@pytest.mark.parametrize("kind", ["diloco", "easgd"])
def test_diloco_and_easgd_send_their_top_k_as_the_reference_does(kind):
    p, steps = 3, 7
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    make = {"diloco": lambda: DiLoCo(period=2, compression=topk(*K2)),
            "easgd": lambda: EASGD(period=2, moving_rate=0.3, compression=topk(*K2))}[kind]
    models, opts = least_squares_ranks(cluster, make, lambda: keras.optimizers.SGD(0.1), w0)
    least_squares.train(cluster, models, opts, shards, steps, 4)
    expected, residuals = strategies_reference(kind, shards, w0, steps)
    for model, w in zip(models, expected):
        got = model.layers[0].kernel.numpy().ravel()
        assert np.linalg.norm(got - w) <= 1e-5 * np.linalg.norm(w), (got, w)
    state = [[v for v in o.strategy.state_variables() if "residual" in v.name] for o in opts]
    if kind == "diloco":  # per-rank residuals, four of the six pseudo-gradient elements each
        for kept, r in zip(state, residuals):
            assert len(kept) == 1 and np.count_nonzero(kept[0].numpy()) >= 4
            np.testing.assert_allclose(kept[0].numpy().ravel(), r, rtol=1e-4, atol=1e-7)
    else:  # none: what was not sent stays in x_i - x̃ (easgd.py)
        assert state == [[]] * p
    message = ref.topk_message_bytes(ref.DIM, 1, *K2)
    for comm in cluster.communicators:
        assert comm.account(wire=True) == {"bytes": 3 * message, "calls": 3, "wire_bytes": 3 * (p - 1) * message}
    traffic = opts[0].strategy.expected_traffic(models[0].trainable_variables, ranks_per_host=p).total
    assert (traffic.bytes, traffic.calls, traffic.wire_bytes) == (message / 2, 0.5, (p - 1) * message / 2)


def test_a_mid_period_diloco_resume_continues_bit_for_bit(tmp_path):
    p, saved_at, more = 2, 5, 5  # tau = 3: synchronised at 3, saved at 5, then 6 and 9
    shards, w0 = ref.least_squares_shards(p)
    make = lambda: DiLoCo(period=3, compression=topk(*K2))

    def ranks(weights):
        cluster = SimulatedCluster(p)
        return (cluster, *least_squares_ranks(cluster, make, lambda: keras.optimizers.Adam(0.05), weights))

    cluster, models, opts = ranks(w0)
    least_squares.train(cluster, models, opts, shards, saved_at, 4)
    assert np.any(opts[0].strategy.error_feedback.residuals[0].numpy())
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], opts[r].comm, {},
                                          step_in_epoch=saved_at, steps_per_epoch=100))
    again, resumed, resumed_opts = ranks(w0 + 50.0)  # other weights: the restore must set them
    manifest, directory = checkpoint.latest(str(tmp_path))
    again.run(lambda r: checkpoint.restore(directory, manifest, resumed[r], resumed_opts[r], resumed_opts[r].comm))
    least_squares.train(cluster, models, opts, shards, more, 4, start=saved_at)
    least_squares.train(again, resumed, resumed_opts, shards, more, 4, start=saved_at)
    for r in range(p):  # weights, inner slots, θ, outer momentum, residual, counters
        expected, got = (checkpoint.state_arrays(m[r], o[r]) for m, o in ((models, opts), (resumed, resumed_opts)))
        residual = resumed_opts[r].strategy.error_feedback.residuals[0].numpy()
        assert sorted(expected) == sorted(got) and any(np.array_equal(v, residual) for v in got.values())
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


# --- options, refusals, state ------------------------------------------------------------------
def test_the_options_round_trip_and_the_residuals_restart_at_zero_at_another_size():
    fmt = topk(0.05, 4)
    assert config_of(fmt) == {"name": "topk", "density": 0.05, "bits": 4} and config_of(Compression.int4) == "int4"
    assert Compression.of(config_of(fmt)) == fmt and Compression.of("topk") is Compression.topk
    for strategy in (DiLoCo(compression=fmt), EASGD(compression=fmt), DiLoCo(compression="topk")):
        again = type(strategy).from_config(strategy.get_config())
        assert again.compression == strategy.compression and again.get_config() == strategy.get_config()
    strategy = DiLoCo(compression=fmt)
    strategy.build([tf.Variable(tf.ones([3, 2])), tf.Variable(tf.ones([2]))])
    rules = strategy.resize_rules()
    assert [rules[id(e)] for e in strategy.error_feedback.residuals] == [resize.RESTART_AT_ZERO] * 2
    # a warm-up sends its gradients in fp32: topk applies to differences only
    assert DiLoCo(warmup_steps=3, compression=fmt).warmup_strategy.compression is Compression.none
    assert EASGD(warmup_steps=3, compression=fmt).warmup_strategy.compression is Compression.none


def test_bad_options_and_strategies_it_does_not_apply_to_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^`density` must be a number with 0 < density <= 1\. Received: density=0$"):
        TopKCompression(density=0)
    with pytest.raises(ValueError, match=r"^`bits` must be one of 1, 2, 4, 8\. Received: bits=3$"):
        TopKCompression(bits=3)
    for make, kind in ((SyncAverage, "gradients"), (PeriodicAverage, "weight differences")):
        with pytest.raises(ValueError, match=rf"^`compression` must be a format that applies to {kind} .*; topk "
                                             r"applies to elastic differences, pseudo-gradients only\."):
            make(compression="topk")


def test_the_command_line_options_reach_the_format_and_the_saved_config():
    config = cli.parse_args(["--strategy", "diloco", "--compression", "topk", "--density", "0.03", "--bits", "4"])
    assert {k: config.as_dict()[k] for k in ("compression", "density", "bits")} == {
        "compression": "topk", "density": 0.03, "bits": 4}
    assert cli.make_strategy(config).compression == topk(0.03, 4)
    default = cli.parse_args(["--strategy", "easgd", "--compression", "topk"])
    assert cli.make_strategy(default).compression == Compression.topk
    hierarchical = cli.make_strategy(cli.parse_args(["--strategy", "hierarchical", "--inter", "diloco",
                                                     "--compression", "topk", "--bits", "1"]))
    assert hierarchical.inter.compression == topk(1 / 64, 1)
    for argv, message in (
            (["--density", "0"], r"^--density must satisfy 0 < D <= 1\. Received: --density=0\.0$"),
            (["--density", "1.5"], r"^--density must satisfy 0 < D <= 1\. Received: --density=1\.5$"),
            (["--bits", "3"], r"^argument --bits: invalid choice: 3 \(choose from 1, 2, 4, 8\)$")):
        with pytest.raises(errors.UsageError, match=message):
            cli.parse_args(argv)
    with pytest.raises(errors.UsageError, match=r"topk applies to elastic differences, pseudo-gradients only"):
        cli.make_strategy(cli.parse_args(["--strategy", "sync", "--compression", "topk"]))
    # a run saved before the options resumes as it ran
    saved = {k: v for k, v in config.as_dict().items() if k not in ("density", "bits")}
    assert config_compare.config_differences(saved, dict(saved, density=1 / 64, bits=2)) == []


# --- the cost model ----------------------------------------------------------------------------
def test_the_cost_model_charges_the_sparse_allgather_its_whole_message_at_every_size():
    level = {"collectives": {"sparse_allgather": {"bytes_a": 4064.0, "bytes_b": 0.0, "calls": 0.1}}}
    link = (1e-3, 1e6)
    for q in (2, 8, 64):  # the table's reference is 8 ranks; the part stays 4,064 bytes at any q
        assert cost_model.level_time(level, 0, q, 8, link) == pytest.approx(0.1 * (q - 1) * (1e-3 + 40640 / 1e6))
    gathered = {"collectives": {"allgather": {"bytes_a": 4064.0, "bytes_b": 0.0, "calls": 0.1}}}
    assert cost_model.level_time(gathered, 0, 64, 8, link) < cost_model.level_time(level, 0, 64, 8, link)
