"""Every rank starts from rank 0's weights and optimizer state, once per optimizer,
with the loss-scale optimizer (if any) where the overflow decision is safe."""
import keras
import tensorflow as tf

from .model_optimizers import distributed_optimizers
from .optimizer import DistributedOptimizer, variable_signature


def move_loss_scaling_inside(model, optimizers=()):
    """Makes the safe loss-scale layout: the one place it is made.

    Rewires ``model.optimizer = LossScaleOptimizer(DistributedOptimizer(opt))``,
    which Keras's ``compile`` builds for a ``mixed_float16`` model, into
    ``DistributedOptimizer(LossScaleOptimizer(opt))``. Outside, the loss-scale
    optimizer would decide on overflow per rank, *before* the reduction: a rank
    that overflows skips the step, never joins the allreduce, and the job
    stalls. Inside, the decision is taken on the reduced gradients, the same on
    every rank. The same objects are kept (no state is lost, even if built),
    and a train function made for the old layout is made again.

    Args:
      model: the Keras model; ``model.optimizer`` is rewired if needed.
      optimizers: DistributedOptimizers that must be safe afterwards.

    Returns:
      True if it rewired ``model.optimizer``.

    Raises:
      ValueError: a layout it cannot make safe: a loss-scale optimizer the
        caller holds outside a DistributedOptimizer (a custom loop's
        ``LossScaleOptimizer(DistributedOptimizer(opt))``, applied through the
        outer object), or one outside and one inside (loss scaled twice).
    """
    outer = getattr(model, "optimizer", None)
    moved = False
    if isinstance(outer, keras.optimizers.LossScaleOptimizer) and isinstance(outer.inner_optimizer,
                                                                            DistributedOptimizer):
        distributed = outer.inner_optimizer
        distributed.wrapped_by_loss_scale = True  # it is, whoever built the wrapper
        if isinstance(distributed.inner_optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError(distributed.loss_scale_layout_problem())
        outer.inner_optimizer = distributed.inner_optimizer
        distributed.inner_optimizer = outer
        distributed.wrapped_by_loss_scale = False
        model.optimizer = distributed
        if distributed.built:
            if not outer.built:
                # Built before compile wrapped it: give the loss-scale optimizer its scale
                # now, outside any trace (the inner optimizer's state is kept: it is built).
                with tf.init_scope():
                    outer.build(list(distributed._trainable_variables))
            distributed._connect_loss_scale()
        if getattr(model, "train_function", None) is not None:
            # Made (perhaps traced) for the old layout: the step must go through the new one.
            model.make_train_function(force=True)
        moved = True
    for optimizer in optimizers:
        problem = optimizer.loss_scale_layout_problem()
        if problem is not None:
            raise ValueError(problem)
    return moved


def broadcast_initial_state(model, optimizer=None, root_rank=0):
    """Gives every rank rank ``root_rank``'s weights and optimizer state.

    Call once before the first step of a custom loop (the
    ``BroadcastInitialState`` callback does it for ``model.fit``).

    Args:
      model: the Keras model; its variables are broadcast.
      optimizer: a ``DistributedOptimizer`` or a list of them (default: every
        one found in ``model``, see ``distributed_optimizers``). A single
        optimizer not built yet is built now on ``model.trainable_variables``
        (as is ``model.optimizer``); the others, such as a GAN's two, which
        each update part of the model, broadcast their state when their first
        ``apply`` builds them. A ``LossScaleOptimizer`` that wraps a
        DistributedOptimizer stands for that one.

    First the loss-scale layout is made safe (``move_loss_scaling_inside``):
    ``compile``'s ``LossScaleOptimizer(DistributedOptimizer)`` under
    ``mixed_float16`` becomes ``DistributedOptimizer(LossScaleOptimizer)``, on
    every call, so ``fit`` without ``callbacks.defaults()`` is safe too.

    Each optimizer's strategy then takes its initial state from the
    synchronised weights (EASGD: x̃ ← x). Once an optimizer holds an agreed
    state (``optimizer.initial_state_synced``) this is a no-op for it, and the
    model's variables are no longer broadcast: a second ``fit`` continues
    from where the first stopped, EASGD's per-rank weights and center included.
    """
    single = optimizer is not None and not isinstance(optimizer, (list, tuple))
    optimizers = [optimizer] if single else list(optimizer) if optimizer is not None else distributed_optimizers(model)
    optimizers = [_distributed_inside(o) for o in optimizers]
    distributed = [o for o in optimizers if isinstance(o, DistributedOptimizer)]
    if not distributed:
        raise ValueError("`optimizer` must be a DistributedOptimizer or a list of them (or the model must hold "
                         f"one). Received: optimizer={optimizer!r}")
    move_loss_scaling_inside(model, distributed)
    for o in distributed:
        o.attach(model)
    if all(o.initial_state_synced for o in distributed):
        _build_now(model, distributed, single)
        return
    comm = distributed[0].comm
    if not any(o.initial_state_synced for o in distributed):
        # Checked before any broadcast: ranks with different variable lists
        # would otherwise wait in broadcasts the others never issue.
        comm.assert_same_across_ranks("the model's variables (a model built differently on some rank?)",
                                      {"model_variables": variable_signature(model.variables)})
        comm.broadcast_variables(model.variables, root_rank)
    for o in distributed:
        eager = single or o is getattr(model, "optimizer", None)
        o.sync_initial_state(root_rank, model.trainable_variables if eager else None)


def _distributed_inside(optimizer):
    """The DistributedOptimizer a LossScaleOptimizer wraps (e.g. ``model.optimizer``
    as compile made it), else ``optimizer`` itself."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and isinstance(inner, DistributedOptimizer):
        return inner
    return optimizer


def _build_now(model, optimizers, single):
    for o in optimizers:
        if not o.built and (single or o is getattr(model, "optimizer", None)):
            o.build(model.trainable_variables)
