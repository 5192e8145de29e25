"""The model you keep: the weights a strategy hands back as the result of training.

Under SyncAverage it is the model's own weights (identical on every rank).
Under EASGD it is the center x̃, not a rank's local weights x_i. Strategies
report it through ``SyncStrategy.kept_variables()`` (one variable per
trainable variable, or ``None`` for "the model's own"); the strategies the
hierarchy work adds (periodic averaging, DiLoCo's outer weights, a
hierarchical center) implement the same method, and everything here works
for them unchanged.

Example::

    model.fit(x, y, callbacks=hvd_easgd.callbacks.defaults())
    with hvd_easgd.KeptWeights(model):          # the center is in the model
        model.evaluate(x_test, y_test)
        predictions = model.predict(x_test)
    if hvd_easgd.rank() == 0:
        hvd_easgd.save_kept_model(model, "model.keras")   # plain Keras file

A custom loop whose model was never compiled names its optimizer(s):
``hvd_easgd.KeptWeights(model, opt)``, ``save_kept_model(model, path, opt)``.
"""
import numpy as np

from .model_optimizers import distributed_optimizers


def _optimizers(model, optimizers):
    """The DistributedOptimizers to ask: the ones given (one or a list), else the model's."""
    if optimizers is None:
        return distributed_optimizers(model)
    return list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]


def kept_variable_pairs(model, optimizers=None):
    """``[(model_variable, kept_variable or value)]`` over the DistributedOptimizers
    (``optimizers``, default the model's), for the variables whose kept value
    is not the model's own: the end-of-training merge's (``merge_at_end``) while no
    step has been taken since it, else the strategy's ``kept_variables()``."""
    pairs = []
    for optimizer in _optimizers(model, optimizers):
        if not optimizer.built:
            continue
        kept = _merged(optimizer)
        if kept is None:
            kept = optimizer.strategy.kept_variables()
        if kept is not None:
            pairs.extend(zip(optimizer._trainable_variables, kept))
    return pairs


def _merged(optimizer):
    """The kept weights ``merge_at_end`` computed for ``optimizer``, or None (none, or steps taken since)."""
    merged = getattr(optimizer, "_merged_kept", None)
    if merged is None or merged[0] != int(optimizer.strategy.step_counter.numpy()):
        return None
    return merged[1]


def kept_weights(model, optimizers=None):
    """The kept model's trainable weights as NumPy arrays, in ``model.trainable_variables`` order."""
    kept = {id(v): k for v, k in kept_variable_pairs(model, optimizers)}
    return [_array(kept.get(id(v), v)) for v in model.trainable_variables]


def _array(value):
    """A variable's value, or a merged one (already an array), as a NumPy array of its own."""
    return np.array(value.numpy() if hasattr(value, "numpy") else value)


class KeptWeights:
    """Context manager: inside the block the model holds the kept weights;
    its own (local) weights come back on exit.

    Nesting is safe: an inner block finds the kept weights already in.
    ``optimizers`` (one or a list) is needed only when the model does not hold
    its DistributedOptimizers (a custom loop on an uncompiled model).
    """

    def __init__(self, model, optimizers=None):
        self.model = model
        self.optimizers = optimizers
        self._saved = None

    @property
    def active(self):
        return self._saved is not None

    def __enter__(self):
        if self.active:
            return self
        pairs = kept_variable_pairs(self.model, self.optimizers)
        self._saved = [(v, np.array(v.numpy())) for v, _ in pairs]
        for v, k in pairs:
            v.assign(k)
        _swapped_in[id(self.model)] = self
        return self

    def __exit__(self, *exc):
        if self.active:
            for v, local in self._saved:
                v.assign(local)
            self._saved = None
            _swapped_in.pop(id(self.model), None)
        return False


# model id -> the KeptWeights whose kept weights are in it: lets a per-rank
# checkpoint take the local weights even while a callback has swapped them out.
_swapped_in = {}


class LocalWeights:
    """Context manager: the model's own (local) weights inside the block, even
    if a ``KeptWeights`` swap is active (hvd_easgd's per-rank checkpoints must
    hold the local weights, or exact resume breaks)."""

    def __init__(self, model):
        self.model = model
        self._swap = None
        self._kept = None

    def __enter__(self):
        self._swap = _swapped_in.get(id(self.model))
        if self._swap is not None:
            self._kept = [(v, np.array(v.numpy())) for v, _ in self._swap._saved]
            for v, local in self._swap._saved:
                v.assign(local)
        return self

    def __exit__(self, *exc):
        if self._swap is not None:
            for v, kept in self._kept:
                v.assign(kept)
            self._swap = self._kept = None
        return False


def merge_at_end(model, optimizers=None):
    """Once training is over, on every rank alike: the kept model takes what the ranks
    hold since their last synchronisation (``SyncStrategy.merge_at_end``: DiLoCo's outer
    step on the partial period, PeriodicAverage's average, EASGD's center onto the workers'
    mean), so that the model you keep holds every update. A synchronisation in flight is
    merged first. Call it before evaluating or saving the kept model; ``fit`` with
    ``callbacks.defaults()`` calls it when it ends.

    The training state is left as it was: the merge runs on it, the kept weights it gives
    are read, and every variable it changed is put back. So a second ``fit`` continues as
    one longer ``fit`` would, bit for bit, and a checkpoint holds what it always held; the
    kept model is the merged one until the next step. ``optimizers`` as for ``KeptWeights``."""
    for optimizer in _optimizers(model, optimizers):
        if not optimizer.built:
            continue
        strategy = optimizer.strategy
        strategy.drain()
        touched = (list(optimizer._trainable_variables) + list(optimizer._non_trainable_variables)
                   + strategy.state_variables())
        saved = [_array(v) for v in touched]
        strategy.merge_at_end()
        merged = [_array(k) for k in strategy.kept_variables() or optimizer._trainable_variables]
        for v, value in zip(touched, saved):
            v.assign(value)
        strategy.on_state_restored()  # what the strategy derives from its state (a gathered model) is re-read
        optimizer._merged_kept = (int(strategy.step_counter.numpy()), merged)


def save_kept_model(model, filepath, optimizers=None):
    """Saves the kept model as a plain Keras file (``keras.models.load_model``
    reads it without hvd_easgd). Call it on one rank, after ``fit`` (whose
    callbacks have averaged the BatchNorm statistics across ranks).
    ``optimizers`` as for ``KeptWeights``."""
    optimizers = _optimizers(model, optimizers)
    for optimizer in optimizers:
        optimizer.attach(model)  # the compile config then names the inner optimizer
    with KeptWeights(model, optimizers):
        model.save(filepath)
