"""NumPy references of the update rules, written from the equations alone.

Tests compare hvd_easgd's TF implementation against these on a small
least-squares problem: loss_r(w) = ½·mean((X_r w − y_r)²) on rank r's shard,
gradient X_rᵀ(X_r w − y_r)/n_r.
"""
import numpy as np

DIM = 6


def least_squares_shards(size, rows_per_rank=16, seed=7):
    """A different shard per rank, and the shared initial weights."""
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(DIM)
    shards = []
    for _ in range(size):
        x = rng.standard_normal((rows_per_rank, DIM))
        y = x @ w_true + 0.1 * rng.standard_normal(rows_per_rank)
        shards.append((x, y))
    w0 = rng.standard_normal(DIM)
    return shards, w0


def grad(w, x, y):
    return x.T @ (x @ w - y) / len(y)


def densified(indices, values, rows):
    """The dense gradient a sparse one (tf.IndexedSlices' indices and values) stands for: each
    ``values[k]`` added into row ``indices[k]`` of zeros with ``rows`` rows. np.add.at, because a
    fancy-index assignment would keep only the last value of a repeated index."""
    values = np.asarray(values)
    dense = np.zeros((rows,) + values.shape[1:], values.dtype)
    np.add.at(dense, np.asarray(indices), values)
    return dense


def batch(shard, step, batch_size):
    """Micro-batch ``step`` of a shard, cycling."""
    x, y = shard
    n = len(y)
    idx = [(step * batch_size + i) % n for i in range(batch_size)]
    return x[idx], y[idx]


class SGDRef:
    """Keras 3 SGD, including its Nesterov form (which stores the look-ahead point)."""

    def __init__(self, lr, momentum=0.0, nesterov=False):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.m = None

    def step(self, w, g):
        if self.momentum == 0:
            return w - self.lr * g
        if self.m is None:
            self.m = np.zeros_like(w)
        self.m = self.momentum * self.m - self.lr * g
        if self.nesterov:
            return w + self.momentum * self.m - self.lr * g
        return w + self.m


def sync_average_reference(shards, w0, lr, steps, batch_size):
    w = w0.copy()
    opt = SGDRef(lr)
    for t in range(steps):
        g = np.mean([grad(w, *batch(s, t, batch_size)) for s in shards], axis=0)
        w = opt.step(w, g)
    return w


def easgd_reference(shards, w0, lr, tau, alpha, steps, batch_size, overlap=False, warmup_steps=0,
                    momentum=0.0, nesterov=False, rho=0.0):
    """Returns (local weights per rank, center) after ``steps`` optimizer steps.

    Step t (1-based, counted after warm-up): inner update, then if t % tau == 0
    the elastic step d_i = α(x_i − x̃), x_i −= d_i, x̃ += Σd. With overlap, d is
    taken from x_i and x̃ at the start of the step and applied after the update.
    """
    p = len(shards)
    xs = [w0.copy() for _ in range(p)]
    opts = [SGDRef(lr, momentum, nesterov) for _ in range(p)]
    center = w0.copy()
    for step in range(steps):
        if step < warmup_steps:
            g = np.mean([grad(xs[0], *batch(s, step, batch_size)) for s in shards], axis=0)
            xs = [opts[i].step(xs[i], g) for i in range(p)]
            if step + 1 == warmup_steps:
                center = xs[0].copy()
            continue
        t = step + 1 - warmup_steps
        communicates = t % tau == 0
        if communicates and overlap:
            diffs = [alpha * (x - center) for x in xs]
        new = []
        for i in range(p):
            g = grad(xs[i], *batch(shards[i], step, batch_size)) + rho * (xs[i] - center)
            new.append(opts[i].step(xs[i], g))
        xs = new
        if communicates:
            if not overlap:
                diffs = [alpha * (x - center) for x in xs]
            xs = [x - d for x, d in zip(xs, diffs)]
            center = center + np.sum(diffs, axis=0)
    return xs, center


def orthonormal_columns(p):
    """Gram–Schmidt on the columns of ``p`` in order; a vanishing column becomes zero."""
    columns = []
    for i in range(p.shape[1]):
        column = p[:, i].copy()
        for previous in columns:
            column = column - (column @ previous) * previous
        norm = np.linalg.norm(column)
        columns.append(column / norm if norm > 0 else np.zeros_like(column))
    return np.stack(columns, axis=1)


def powersgd_step(grads_by_rank, residuals_by_rank, q):
    """One PowerSGD step for one matrix over p ranks (Vogels et al. 2019, with
    the per-rank error of the rank's own share).

    Args:
      grads_by_rank: p arrays (n, m), rank r's gradient sum G_r.
      residuals_by_rank: p arrays (n, m), rank r's error feedback e_r.
      q: (m, R), the shared factor from the last step (warm start).

    Returns:
      ``(approximate Σ_r G_r, new residuals by rank, new q)``.
    """
    ms = [g + e for g, e in zip(grads_by_rank, residuals_by_rank)]
    basis = orthonormal_columns(sum(m @ q for m in ms))
    shares = [m.T @ basis for m in ms]
    q_new = sum(shares)
    residuals = [m - basis @ s.T for m, s in zip(ms, shares)]
    return basis @ q_new.T, residuals, q_new


def resized_state_reference(states, ranks, rank, sum_on_first=(), weights_from=None):
    """Rank ``rank`` of ``ranks``' state after a resize, from the p saved ``states``
    ({key: array} per rank), written from the rules alone: a value every rank
    shares is kept; else floating values are averaged, integers are rank 0's;
    the keys in ``sum_on_first`` are summed onto rank 0 (zeros elsewhere); and
    ``weights_from`` ({weight key: key}) restarts weights from another variable."""
    out = {}
    for key in states[0]:
        values = [np.asarray(s[key]) for s in states]
        if key in sum_on_first:
            total = np.sum(np.stack(values).astype(np.float64), axis=0).astype(values[0].dtype)
            out[key] = total if rank == 0 else np.zeros_like(values[0])
        elif all(np.array_equal(values[0], v) for v in values) or not np.issubdtype(values[0].dtype, np.floating):
            out[key] = values[0]
        else:
            out[key] = np.mean(np.stack(values).astype(np.float64), axis=0).astype(values[0].dtype)
    for weight, source in (weights_from or {}).items():
        out[weight] = out[source]
    return out


# --- compression: the formats and the quantised allreduce, from comm/compression's docstrings ----
BLOCK = 256
LEVELS = {"int8": 127, "int4": 7}
SIGN_BLOCK = 2048


def quantise_reference(x, name):
    """What a rank's flat float32 payload ``x`` stands for once encoded by format ``name``
    (none, fp16, bf16, int8, int4, sign): blocks of 256, s = max|x|/Q, q = round(x/s) (ties to
    even), x̂ = q·s; fp16/bf16 round to nearest even; sign below. Its scale is a mean, summed in
    another order than TF's: within float32 rounding of the library's, not bit for bit."""
    x = np.asarray(x, np.float32)
    if name == "none":
        return x.copy()
    if name == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if name == "bf16":
        import ml_dtypes  # TF's own bfloat16 for NumPy

        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    n = x.size
    if name == "sign":  # blocks of 2048, s = mean|x|, x̂ = ±s by the sign (+ for zero)
        blocks = np.pad(x, (0, -n % SIGN_BLOCK)).reshape(-1, SIGN_BLOCK)
        scales = np.abs(blocks).mean(axis=1, dtype=np.float32)
        return np.where(blocks >= 0, scales[:, None], -scales[:, None]).astype(np.float32).reshape(-1)[:n]
    levels = np.float32(LEVELS[name])
    blocks = np.pad(x, (0, -n % BLOCK)).reshape(-1, BLOCK)
    scales = (np.abs(blocks).max(axis=1) / levels).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))[:, None]
    codes = np.clip(np.where(scales[:, None] > 0, np.round(blocks / safe), 0), -levels, levels).astype(np.float32)
    return (codes * scales[:, None]).reshape(-1)[:n]


def equals_quantised_reference(got, expected, name):
    """Whether ``got`` is ``quantise_reference``'s (or ``quantised_allreduce_reference``'s) ``expected``:
    bit for bit, and for sign, whose scale is a mean summed in another order, within float32 rounding."""
    got, expected = np.asarray(got), np.asarray(expected)
    if name != "sign":
        return bool(np.array_equal(got, expected))
    return bool(np.max(np.abs(got - expected)) <= 4e-7 * np.max(np.abs(expected)))


def quantised_allreduce_reference(payloads, name):
    """Σ over ranks of the flat float32 ``payloads`` as the quantised allreduce computes it:
    every rank's decoded payload added in fp32 in rank order; from p = 3 on (alltoall +
    allgather) that sum is encoded and decoded once more. fp16 (summable) is added in fp16."""
    if name == "fp16":
        total = np.zeros_like(np.asarray(payloads[0], np.float16))
        for x in payloads:
            total = (total + np.asarray(x, np.float32).astype(np.float16)).astype(np.float16)
        return total.astype(np.float32)
    total = np.zeros(np.asarray(payloads[0]).shape, np.float32)
    for x in payloads:
        total = total + quantise_reference(x, name)
    return total if len(payloads) <= 2 or name == "none" else quantise_reference(total, name)


def quantised_message_bytes(elements, exact_values, name, p):
    """One message of the quantised allreduce: blocks (bytes each: int8 256+4, int4 128+4, bf16 2 per
    element) then 4 bytes per exact value; from p = 3 on, a 1/p chunk of ceil(blocks/p) blocks."""
    block, block_bytes = {"int8": (256, 260), "int4": (256, 132), "bf16": (1, 2), "sign": (2048, 260)}[name]
    blocks = -(-elements // block)
    if p > 2:
        blocks = -(-blocks // p)
    return blocks * block_bytes + 4 * exact_values


# --- the sparse payload (topk), from comm/compression/topk.py's docstring ----------------------------
TOPK_CHUNK = 4095  # 2**12 - 1 elements; position 4095 is the sink, which sends nothing


def topk_slots(x, density, bits):
    """Rank's flat float32 payload ``x`` -> per chunk of 4095 (zero-padded): the k = ceil(D·4095)
    slots' positions (4095 where nothing is sent), codes and the chunk's scale s = max|x|. The k
    largest magnitudes, ties to the lower position; cells of width w = s/L, L = 2^(B-1); an element
    is sent where |u| >= s/2^(B+1) and u != 0, as code L·[u < 0] + min(floor(|u|/w), L - 1)."""
    x = np.asarray(x, np.float32).ravel()
    k = int(np.ceil(round(density * TOPK_CHUNK, 9)))
    m = -(-x.size // TOPK_CHUNK)
    chunks = np.pad(x, (0, m * TOPK_CHUNK - x.size)).reshape(m, TOPK_CHUNK)
    positions = np.argsort(-np.abs(chunks), axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(chunks, positions, axis=1)
    scales = np.abs(chunks).max(axis=1)
    levels = 2 ** (bits - 1)
    cell = scales.astype(np.float64) / levels
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(cell[:, None] > 0, np.floor(np.abs(values) / cell[:, None]), 0)
    q = np.minimum(q, levels - 1).astype(np.int64)
    sent = (np.abs(values) >= scales[:, None] * np.float32(2.0 ** -(bits + 1))) & (values != 0)
    codes = np.where(sent, q + levels * (values < 0), 0)
    return np.where(sent, positions, TOPK_CHUNK), codes, scales


def topk_reference(x, density, bits):
    """What ``x`` stands for once sent as topk: each sent slot's (2q + 1)·s·2^-B, with its sign, at
    its position; zero elsewhere. Flat, ``x``'s length."""
    positions, codes, scales = topk_slots(x, density, bits)
    levels = 2 ** (bits - 1)
    unit = scales * np.float32(2.0 ** -bits)
    magnitudes = (2 * (codes % levels) + 1).astype(np.float32) * unit[:, None]
    dense = np.zeros((len(scales), TOPK_CHUNK + 1), np.float32)
    np.put_along_axis(dense, positions, np.where(codes >= levels, -magnitudes, magnitudes), axis=1)
    return dense[:, :TOPK_CHUNK].ravel()[:np.asarray(x).size]


def topk_message(x, density, bits):
    """The coded bytes of ``x`` as the layout says: positions two to 3 bytes (a & 0xFF,
    a >> 8 | (b & 0xF) << 4, b >> 4; an odd count padded with a sink), codes 8/B a byte from the low
    bits, float32 scales."""
    positions, codes, scales = topk_slots(x, density, bits)
    flat = positions.ravel()
    flat = np.concatenate([flat, [TOPK_CHUNK] * (flat.size % 2)]).astype(np.uint32)
    a, b = flat[0::2], flat[1::2]
    position_bytes = np.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], axis=1).astype(np.uint8).ravel()
    per_byte = 8 // bits
    codes = codes.ravel()
    codes = np.concatenate([codes, [0] * (-codes.size % per_byte)]).astype(np.uint32).reshape(-1, per_byte)
    code_bytes = np.zeros(len(codes), np.uint32)
    for j in range(per_byte):
        code_bytes |= codes[:, j] << (bits * j)
    return np.concatenate([position_bytes, code_bytes.astype(np.uint8),
                           scales.astype("<f4").view(np.uint8)])


def topk_message_bytes(elements, exact_values, density, bits):
    """One rank's message: 3·ceil(n/2) + ceil(n·B/8) + 4m + 4 per exact value, m = ceil(N/4095)
    chunks, n = m·ceil(D·4095) slots."""
    m = -(-elements // TOPK_CHUNK)
    n = m * int(np.ceil(round(density * TOPK_CHUNK, 9)))
    return 3 * -(-n // 2) + -(-n * bits // 8) + 4 * m + 4 * exact_values


def topk_allreduce_reference(payloads, density, bits):
    """Σ over ranks of what each rank's flat payload stands for, added in fp32 in rank order."""
    total = np.zeros(np.asarray(payloads[0]).size, np.float32)
    for x in payloads:
        total = total + topk_reference(x, density, bits)
    return total


def hierarchical_reference(rank_grads, counts, groups, lr, x0, inter, tau=1, alpha=None, outer_lr=0.7,
                           outer_momentum=0.7):
    """Hierarchical's decomposition with SGD(lr) inside (hierarchical.py's docstring).

    Per step each group's gradient sums are cut into n shards of m = ⌈N/n⌉
    (zero-padded: ``reducescatter``'s layout), the inter rule runs on each
    shard across the groups, and the shards are put back. Rows of the
    (n, m) arrays below are the shards.

    Args:
      rank_grads: (steps, p, N) per-sample mean gradients g_r.
      counts: n_r per rank (S_r = n_r · g_r).
      groups: the groups' ranks.
      inter: "sync", "easgd" (``alpha``), "periodic" or "diloco"
        (Nesterov SGD(outer_lr, outer_momentum)); every ``tau`` steps.

    Returns:
      ``(weights per group, kept model)``, each of N elements; the kept model
      is the center (easgd), θ (diloco) or None.
    """
    n, size = len(groups[0]), x0.size
    m = -(-size // n)

    def shards(v):
        padded = np.zeros(n * m)
        padded[:size] = v
        return padded.reshape(n, m)

    x = [shards(x0.astype(np.float64)) for _ in groups]
    kept = shards(x0.astype(np.float64))
    outer = SGDRef(outer_lr, outer_momentum, nesterov=True)
    for t, g in enumerate(rank_grads, start=1):
        sums = [shards(sum(counts[r] * g[r].astype(np.float64) for r in group)) for group in groups]
        group_counts = [sum(counts[r] for r in group) for group in groups]
        if inter == "sync":
            mean = sum(sums) / sum(group_counts)
            x = [xg - lr * mean for xg in x]
        else:
            x = [xg - lr * s / c for xg, s, c in zip(x, sums, group_counts)]
            if t % tau == 0:
                if inter == "easgd":
                    d = [alpha * (xg - kept) for xg in x]
                    x = [xg - dg for xg, dg in zip(x, d)]
                    kept = kept + sum(d)
                elif inter == "periodic":
                    x = [sum(x) / len(x)] * len(x)
                else:  # diloco: θ takes the outer step on the mean pseudo-gradient, every group restarts from it
                    kept = outer.step(kept, sum(kept - xg for xg in x) / len(x))
                    x = [kept.copy() for _ in x]
    flat = lambda v: v.ravel()[:size]  # noqa: E731
    return [flat(xg) for xg in x], flat(kept) if inter in ("easgd", "diloco") else None


def overlap_reference(strategy, shards, w0, lr, tau, steps, batch_size, delta, alpha=None, drain_after=None):
    """Returns (local weights per rank, EASGD's center or None) after ``steps`` plain-SGD steps with
    overlap δ: the synchronisation starts after the inner update of t ≡ −δ (mod τ) and merges after that
    of t ≡ 0 (t 1-based); ``drain_after=k`` merges what is in flight right after step k.

    EASGD sends d_i = α(x_i − x̃) and merges x_i −= d_i, x̃ += Σd; PeriodicAverage sends x_i(t) and merges
    x_i ← mean_j x_j(t) + (x_i − x_i(t)).
    """
    p = len(shards)
    xs = [w0.copy() for _ in range(p)]
    center = w0.copy()
    pending = None

    def merge(xs, center, sent):
        if strategy == "easgd":
            return [x - d for x, d in zip(xs, sent)], center + np.sum(sent, axis=0)
        mean = np.sum(sent, axis=0) / p
        return [mean + (x - s) for x, s in zip(xs, sent)], center

    for step in range(steps):
        t = step + 1
        xs = [x - lr * grad(x, *batch(shards[i], step, batch_size)) for i, x in enumerate(xs)]
        if pending is not None and t % tau == 0:
            xs, center = merge(xs, center, pending)
            pending = None
        if (t + delta) % tau == 0:
            pending = [alpha * (x - center) for x in xs] if strategy == "easgd" else [x.copy() for x in xs]
        if drain_after == t and pending is not None:
            xs, center = merge(xs, center, pending)
            pending = None
    return xs, (center if strategy == "easgd" else None)


class DiLoCoOverlapReference:
    """DiLoCo with overlap δ (diloco.py's docstring), SGD(lr) inner, the outer optimizer Keras's
    Nesterov SGD(0.7, 0.7) per fragment; fragment f (``masks[f]``, its elements of the flat weights)
    starts at t ≡ ⌊fτ/F⌋ (mod τ), t = 1, 2, ...:

      start:   u_i = θ_f − x_if (+ e_if)                    (kept as pending)
      merge δ steps later (or at a drain):
               mean = Σ_i Q(u_i) / p,  e_if ← u_i − Q(u_i) (int8/int4),
               θ_f ← outer_f(θ_f, mean),  x_if ← θ_f + x_if − x_if(start)     (``merge="progress"``, the default)
               (the "mix" merge instead: x_if ← α x_if + (1 − α) θ_f, α the mixing factor)

    With δ = 0 the merge is the blocking one: x_if ← θ_f. ``drain_after=k`` merges what is in flight
    right after step k."""

    def __init__(self, shards, w0, masks, tau, delta, mixing=0.5, name="none", lr=0.05, batch_size=4,
                 merge="progress"):
        self.shards, self.masks, self.tau, self.delta, self.mixing = shards, masks, tau, delta, mixing
        self.merge_rule = merge
        self.name, self.batch_size = name, batch_size
        self.xs, self.theta = [w0.astype(np.float64) for _ in shards], w0.astype(np.float64)
        self.outers = [SGDRef(0.7, 0.7, nesterov=True) for _ in masks]
        self.residuals = [np.zeros_like(self.theta) for _ in shards]
        self.inner = SGDRef(lr)
        self.pending = None  # (fragment, its start step, the payloads)

    def offset(self, f):
        return f * self.tau // len(self.masks)

    def merge(self):
        f, _, payloads, sent = self.pending
        mask, p = self.masks[f], len(self.shards)
        mean = quantised_allreduce_reference(payloads, self.name) / p
        if self.name in LEVELS or self.name == "sign":
            for e, u in zip(self.residuals, payloads):
                e[mask] = u - quantise_reference(u, self.name)
        self.theta[mask] = self.outers[f].step(self.theta[mask], mean)
        alpha = self.mixing if self.delta else 0.0
        for x, x_start in zip(self.xs, sent):
            if self.merge_rule == "progress" and self.delta:
                x[mask] = self.theta[mask] + x[mask] - x_start
            else:
                x[mask] = alpha * x[mask] + (1 - alpha) * self.theta[mask]
        self.pending = None

    def run(self, steps, start=0, drain_after=None):
        for step in range(start, start + steps):
            self.xs = [self.inner.step(x, grad(x, *batch(s, step, self.batch_size)))
                       for x, s in zip(self.xs, self.shards)]
            t = step + 1
            if self.pending is not None and t == self.pending[1] + self.delta:
                self.merge()
            for f, mask in enumerate(self.masks):
                if t % self.tau == self.offset(f):
                    self.pending = (f, t, [self.theta[mask] - x[mask] + e[mask]
                                           for x, e in zip(self.xs, self.residuals)],
                                    [x[mask].copy() for x in self.xs])
                    if self.delta == 0:
                        self.merge()
            if drain_after == t and self.pending is not None:
                self.merge()
        return self.xs, self.theta
