"""The DistributedOptimizers a Keras model trains with, wherever Keras code keeps them.

Keras code does not always keep its one optimizer in ``model.optimizer``:

* a GAN's custom ``compile`` keeps two (``d_optimizer``, ``g_optimizer``) as
  attributes and leaves Keras's default RMSprop in ``model.optimizer``;
* under ``mixed_float16``, ``compile`` wraps the optimizer it is given in a
  ``LossScaleOptimizer``, outside the ``DistributedOptimizer``.

The callbacks go through these helpers instead of assuming
``model.optimizer`` is a ``DistributedOptimizer``.
"""
import keras

from .optimizer import DistributedOptimizer

NO_DISTRIBUTED_OPTIMIZER = (
    "hvd_easgd found no DistributedOptimizer in the model (looked at model.optimizer, at optimizers kept as "
    "model attributes such as a GAN's d_optimizer/g_optimizer, and inside LossScaleOptimizers). Wrap each "
    "optimizer you train with before compile, e.g. `hvd_easgd.DistributedOptimizer(keras.optimizers.Adam())`. "
    "Received: model.optimizer={optimizer!r}"
)


def _wrapped(optimizer):
    """``optimizer`` and each optimizer it wraps, outermost first."""
    while isinstance(optimizer, keras.optimizers.Optimizer):
        yield optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)


def distributed_optimizers(model):
    """Every DistributedOptimizer reachable from ``model``, ``model.optimizer``'s first.

    Looks at ``model.optimizer`` and at every optimizer the model holds as an
    attribute (set by a custom ``compile``), through any wrapper that keeps
    an ``inner_optimizer`` (``LossScaleOptimizer``).
    """
    candidates = [getattr(model, "optimizer", None)]
    candidates += [value for value in vars(model).values() if isinstance(value, keras.optimizers.Optimizer)]
    found = []
    for candidate in candidates:
        for optimizer in _wrapped(candidate):
            if isinstance(optimizer, DistributedOptimizer) and all(optimizer is not f for f in found):
                found.append(optimizer)
    return found


def require_distributed_optimizers(model):
    """``distributed_optimizers(model)``, or a ValueError that says what to do."""
    found = distributed_optimizers(model)
    if not found:
        raise ValueError(NO_DISTRIBUTED_OPTIMIZER.format(optimizer=getattr(model, "optimizer", None)))
    return found


def communicator_of(model):
    """The communicator of the model's first DistributedOptimizer, else the process's."""
    found = distributed_optimizers(model)
    if found:
        return found[0].comm
    from ..startup.runtime import communicator

    return communicator()

