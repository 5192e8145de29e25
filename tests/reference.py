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
