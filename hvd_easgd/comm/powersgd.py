"""PowerSGD: rank-R gradient compression over the ordinary allreduce.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization" (NeurIPS 2019, arXiv:1905.13727);
the semantics follow PyTorch's DDP communication hook ``powerSGD_hook``.

One compressed step, on rank r, for each gradient matrix G_r (n × m) with
its residual e_r and the shared factor Q (m × R)::

    M_r = G_r + e_r                      error feedback: what earlier steps left out
    P   = Σ_r M_r Q                      allreduce 1 (with the uncompressed tensors)
    P̂   = orthonormal columns of P       Gram–Schmidt, the same bits on every rank
    Q_r = M_rᵀ P̂                         this rank's share of the right factor
    Q   = Σ_r Q_r                        allreduce 2; kept for the next step (warm start)
    Σ_r G_r ≈ P̂ Qᵀ                       what every rank applies (then scaled as SyncAverage does)
    e_r ← M_r − P̂ Q_rᵀ                   this rank's own compression error

The residual is the error of this rank's own share (P̂ P̂ᵀ M_r), as in the
paper, so Σ_r e_r is exactly what the applied sum left out of Σ_r M_r: no
error is lost or counted twice. Every rank orthogonalises the same summed
P and multiplies by the same summed Q, so every rank applies the same bits;
only the residuals differ between ranks.

Which tensors are compressed: a tensor of shape (d_1, ..., d_k), k ≥ 2, is
the matrix n × m with m = d_k and n = d_1·…·d_{k−1} (Keras keeps output units
and channels last: a Dense kernel is (in, out), a Conv2D kernel (h, w, in,
out), so rows are the inputs of one output). It is compressed at rank
R' = min(R, n, m) when its compression rate n·m / ((n + m)·R') is at least
``min_compression_rate``. Vectors (biases, BatchNorm scales) and smaller
matrices are sent uncompressed, summed in the first allreduce.

Bytes per compressed step (one rank, payload handed to the collectives)::

    Σ over compressed matrices (n + m)·R'·itemsize  +  Σ over the others elements·itemsize

in two allreduce calls (P with the uncompressed tensors, then Q).
"""
import numpy as np
import tensorflow as tf

from .. import validation
from .compression.powersgd_choice import DEFAULT_RANK
# PyTorch's start_powerSGD_iter defaults to 1,000 steps, sized for runs of
# tens of thousands; this project's runs are hundreds of steps (digits at
# np = 2: 22 steps an epoch), so 1,000 would never compress. A few
# exact steps first let the weights leave their random start, where the
# gradients change fastest and a rank-R warm start has nothing to track.
DEFAULT_WARMUP_STEPS = 10
# PyTorch's default too: a matrix whose factors are more than half its size
# saves less than half its bytes, yet pays the whole approximation error and a
# second collective; sent whole it is exact.
DEFAULT_MIN_COMPRESSION_RATE = 2.0
# Q's initial values: a fixed seed, so every rank starts from the same Q
# without a broadcast (rank r's own seed would split the ranks).
_Q_SEED = 20190513


def matrix_shape(shape):
    """``shape`` as the matrix (n, m) PowerSGD works on: m the last axis,
    n the product of the others; None for a scalar or a vector."""
    dims = [int(d) for d in shape]
    if len(dims) < 2:
        return None
    return int(np.prod(dims[:-1], dtype=np.int64)), dims[-1]


def orthonormal_columns(matrix):
    """Gram–Schmidt on the columns of ``matrix`` (n × R), in order.

    Deterministic (no pivoting, no library QR whose algorithm may change), so
    equal inputs give equal bits on every rank. A column that vanishes (a
    zero gradient, or a rank above the matrix's own) becomes zero rather
    than 0/0: it then adds nothing to the approximation.
    """
    columns = []
    for i in range(matrix.shape[1]):
        column = matrix[:, i]
        for previous in columns:
            column = column - tf.reduce_sum(column * previous) * previous
        columns.append(tf.math.divide_no_nan(column, tf.norm(column)))
    return tf.stack(columns, axis=1)


class PowerSGD:
    """The PowerSGD compressor: its state, its two allreduces and its traffic.

    Args:
      rank: R, the rank of the factors (an integer >= 1; default 4).
      warmup_steps: steps sent uncompressed before the first compressed one
        (an integer >= 0; default 10, see ``DEFAULT_WARMUP_STEPS``).
      min_compression_rate: a matrix is compressed only when n·m / ((n+m)·R')
        is at least this (a number >= 1; default 2).

    ``SyncAverage(compression="powersgd")`` owns one; it calls ``build`` once
    and ``allreduce_sums`` on compressed steps.
    """

    def __init__(self, rank=DEFAULT_RANK, warmup_steps=DEFAULT_WARMUP_STEPS,
                 min_compression_rate=DEFAULT_MIN_COMPRESSION_RATE):
        self.rank = validation.integer("powersgd_rank", rank, minimum=1)
        self.warmup_steps = validation.integer("powersgd_warmup_steps", warmup_steps, minimum=0)
        validation.number("powersgd_min_compression_rate", min_compression_rate, minimum=1)
        self.min_compression_rate = float(min_compression_rate)
        self.residuals = {}  # variable index -> (n, m) error feedback of this rank
        self.factors = {}  # variable index -> (m, R') Q, the same on every rank

    # --- which tensors, at which rank -------------------------------------------------------
    def factor_rank(self, shape):
        """R' for a tensor of ``shape``, or None when it is sent uncompressed."""
        matrix = matrix_shape(shape)
        if matrix is None:
            return None
        n, m = matrix
        rank = min(self.rank, n, m)
        if n * m < self.min_compression_rate * (n + m) * rank:
            return None
        return rank

    def payload_bytes(self, variables):
        """One rank's payload bytes of one compressed step (both calls), from the
        shapes and dtypes of ``variables`` alone: Σ (n+m)·R'·itemsize over the
        compressed matrices plus elements·itemsize over the other tensors."""
        total = 0
        for v in variables:
            itemsize = tf.as_dtype(v.dtype).size
            rank = self.factor_rank(v.shape)
            if rank is None:
                total += int(np.prod([int(d) for d in v.shape], dtype=np.int64)) * itemsize
            else:
                n, m = matrix_shape(v.shape)
                total += (n + m) * rank * itemsize
        return total

    # --- state ------------------------------------------------------------------------
    def build(self, variables, name="powersgd"):
        """Creates the residuals (zeros) and the factors Q (seeded normal, the
        same on every rank) of the compressed ``variables``. Call under init_scope."""
        for index, v in enumerate(variables):
            rank = self.factor_rank(v.shape)
            if rank is None:
                continue
            n, m = matrix_shape(v.shape)
            path = (getattr(v, "path", None) or v.name).replace(":", "_")
            self.residuals[index] = tf.Variable(tf.zeros((n, m), v.dtype), trainable=False,
                                                name=f"{name}_residual/{path}")
            initial = np.random.default_rng([_Q_SEED, index]).standard_normal((m, rank))
            self.factors[index] = tf.Variable(initial.astype(tf.as_dtype(v.dtype).as_numpy_dtype),
                                              trainable=False, name=f"{name}_q/{path}")

    def state_variables(self):
        """Residuals then factors, by variable index: a stable order for checkpoints."""
        return [self.residuals[i] for i in sorted(self.residuals)] + [self.factors[i] for i in sorted(self.factors)]

    # --- one compressed step ----------------------------------------------------------------
    def allreduce_sums(self, comm, grads, riders=()):
        """Σ_r grads (approximated where compressed) over ``comm``'s ranks, in two calls.

        Args:
          comm: the communicator (size > 1).
          grads: this rank's dense gradients (sums), one per built variable.
          riders: more tensors of the gradients' dtype summed exactly in the
            first call (the sample count).

        Returns:
          ``(sums, rider_sums, commit)``: the summed gradients in their
          shapes, the summed riders, and ``commit(condition)``, which stores the
          new residuals and Q where the scalar ``condition`` holds (a step that
          is applied) and leaves them as they were otherwise.
        """
        compressed = sorted(self.residuals)
        plain = [i for i in range(len(grads)) if i not in self.residuals]
        matrices = {i: tf.reshape(grads[i], self.residuals[i].shape) + self.residuals[i] for i in compressed}
        left = [tf.matmul(matrices[i], self.factors[i]) for i in compressed]
        # Non-finite gradients are caught before compressing: this rank's P is
        # then NaN, so the summed P is NaN on every rank and SyncAverage skips
        # the step everywhere. A matmul would spread an Inf too, but 0·Inf and
        # Inf−Inf are the only way it does: say it outright instead.
        if compressed:
            local_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(grads[i])) for i in compressed])
            left = tf.cond(local_finite, lambda: [tf.identity(p) for p in left],
                           lambda: [tf.fill(tf.shape(p), tf.constant(np.nan, p.dtype)) for p in left])
        riders = list(riders)
        first = comm.allreduce(left + [grads[i] for i in plain] + riders, op="sum")
        left_sums, plain_sums = first[:len(compressed)], first[len(compressed):len(compressed) + len(plain)]
        rider_sums = first[len(compressed) + len(plain):]
        bases = [orthonormal_columns(p) for p in left_sums]
        shares = [tf.matmul(matrices[i], basis, transpose_a=True) for i, basis in zip(compressed, bases)]
        right = comm.allreduce(shares, op="sum")

        sums = [None] * len(grads)
        for i, summed in zip(plain, plain_sums):
            sums[i] = summed
        for i, basis, q in zip(compressed, bases, right):
            sums[i] = tf.reshape(tf.matmul(basis, q, transpose_b=True), grads[i].shape)
        new_residuals = [matrices[i] - tf.matmul(basis, share, transpose_b=True)
                         for i, basis, share in zip(compressed, bases, shares)]

        def commit(condition):
            def store():
                for i, residual, q in zip(compressed, new_residuals, right):
                    self.residuals[i].assign(residual)
                    self.factors[i].assign(q)
                return tf.constant(True)

            return tf.cond(condition, store, lambda: tf.constant(False))

        return sums, rider_sums, commit
