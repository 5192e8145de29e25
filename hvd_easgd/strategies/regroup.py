"""Hierarchical's inter state read across two layouts of groups: whole values between shards and variables.

The inter strategy of a sharded Hierarchical (n > 1 ranks per group, G > 1
groups) holds each of its per-weight states (EASGD's center, DiLoCo's θ and
outer slots, a residual) as ONE flat shard of m = ⌈N/n⌉ elements
(``shards.FlatShards``); unsharded (groups of one rank, or one group) it holds
one variable per trainable weight. A checkpoint of one layout therefore does
not line up, entry for entry, with the state of another, and the group size n
may change too. The bridge is the whole value of each such state:

  sharded, rank r of saved group g (ranks g·n .. g·n + n − 1, rank g·n + j
    holding shard j): the group's n shards concatenated in shard order, the
    padding stripped (the first N elements);
  unsharded: the k per-weight entries, flattened in the order of the
    trainable variables and concatenated (N elements).

``in_this_layout`` turns each saved rank's list of inter states into the
list the resumed run's inter strategy holds, with a whole value (a flat N
vector) where it keeps a shard, and the whole value's pieces, reshaped, where
it keeps one variable per weight. The resize rules then map those p lists to
the new rank's (``shards.ReCut`` with one part cuts a whole into the new
rank's shard). Every other entry (counters, a learning rate) is the saved
one. Which entries are per-weight is told by shape: a shard is a vector of m
elements of the weights' dtype; per weight, k consecutive entries shaped and
typed as the k trainable variables.
"""
import numpy as np

from ..comm.communicator import shard_length

SHARD, OTHER = "shard", "other"


class LayoutMismatch(ValueError):
    """The saved inter state does not line up with this run's (another inter strategy or model)."""


def saved_shard_layout(entry):
    """``[n, j, m, N]`` if ``entry`` is a Hierarchical shard layout (``FlatShards.describe``), else None."""
    entry = np.asarray(entry)
    if entry.shape == (4,) and np.issubdtype(entry.dtype, np.integer):
        return [int(x) for x in entry]
    return None


def segments(entries, shapes, dtype, shard=None):
    """The entries as a list of ``(kind, count)``: ``(SHARD, 1)`` for a shard of
    ``shard`` elements (sharded layout), ``(SHARD, k)`` for k per-weight entries
    (``shard`` None: unsharded), ``(OTHER, 1)`` for anything else.

    Args:
      entries: arrays or variables (a ``shape`` and a ``dtype`` each).
      shapes: the k trainable variables' shapes; dtype: theirs.
    """
    def fits(entry, shape):
        return tuple(int(d) for d in entry.shape) == tuple(shape) and np.dtype(_np_dtype(entry.dtype)) == dtype

    out, i = [], 0
    while i < len(entries):
        if shard is not None and fits(entries[i], (shard,)):
            out.append((SHARD, 1))
        elif shard is None and i + len(shapes) <= len(entries) and all(
                fits(entries[i + t], shape) for t, shape in enumerate(shapes)):
            out.append((SHARD, len(shapes)))
        else:
            out.append((OTHER, 1))
        i += out[-1][1]
    return out


def _np_dtype(dtype):
    return getattr(dtype, "as_numpy_dtype", dtype)


def in_this_layout(saved, saved_layouts, current, shapes, dtype, shard=None):
    """The p saved ranks' inter state lists, as this run's inter strategy holds them.

    Args:
      saved: p lists of arrays, rank r's inter state as the saving run held it.
      saved_layouts: p ``[n, j, m, N]`` (the saved run was sharded) or None.
      current: this run's inter state variables (their shapes and dtypes).
      shapes, dtype: the trainable variables' shapes and dtype (N elements).
      shard: m, the length of this run's shards (it keeps a whole per shard
        entry), or None (it keeps one variable per weight: the pieces).

    Raises:
      LayoutMismatch: the saved entries and this run's do not pair up.
    """
    elements = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
    dtype = np.dtype(_np_dtype(dtype))
    n = saved_layouts[0][0] if saved_layouts is not None else None
    if saved_layouts is not None:
        if len(saved) % n or any(layout != [n, r % n, shard_length(elements, n), elements]
                                 for r, layout in enumerate(saved_layouts)):
            raise LayoutMismatch(f"the saved shard layouts {saved_layouts[:n + 1]} are not groups of {n} consecutive "
                                 f"ranks over {elements} elements")
    saved_kinds = segments(saved[0], shapes, dtype, shard_length(elements, n) if n else None)
    current_kinds = segments(current, shapes, dtype, shard)
    if [kind for kind, _ in saved_kinds] != [kind for kind, _ in current_kinds]:
        raise LayoutMismatch(f"the saved inter state ({_describe(saved_kinds)}) does not pair up with this run's "
                             f"({_describe(current_kinds)})")
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    out = []
    for r, entries in enumerate(saved):
        group = saved[r - r % n:r - r % n + n] if n else None
        state, i = [], 0
        for kind, count in saved_kinds:
            if kind == OTHER:
                state.append(entries[i])
            else:
                if n:  # the group's shards in shard order, padding stripped
                    whole = np.concatenate([np.asarray(member[i]).ravel() for member in group])[:elements]
                else:
                    whole = np.concatenate([np.asarray(e).ravel() for e in entries[i:i + count]])
                if shard is not None:
                    state.append(whole)
                else:
                    pieces = np.split(whole, np.cumsum(sizes)[:-1])
                    state += [p.reshape(s) for p, s in zip(pieces, shapes)]
            i += count
        out.append(state)
    return out


def _describe(kinds):
    return ", ".join(f"{kind}×{count}" if kind == SHARD else kind for kind, count in kinds)
