"""Every rank starts from rank 0's weights and optimizer state, once per optimizer."""
from .model_optimizers import distributed_optimizers
from .optimizer import DistributedOptimizer, variable_signature


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
        ``apply`` builds them.

    Each optimizer's strategy then takes its initial state from the
    synchronised weights (EASGD: x̃ ← x). Once an optimizer holds an agreed
    state (``optimizer.initial_state_synced``) this is a no-op for it, and the
    model's variables are no longer broadcast: a second ``fit`` continues
    from where the first stopped, EASGD's per-rank weights and center included.
    """
    single = optimizer is not None and not isinstance(optimizer, (list, tuple))
    optimizers = [optimizer] if single else list(optimizer) if optimizer is not None else distributed_optimizers(model)
    distributed = [o for o in optimizers if isinstance(o, DistributedOptimizer)]
    if not distributed:
        raise ValueError("`optimizer` must be a DistributedOptimizer or a list of them (or the model must hold "
                         f"one). Received: optimizer={optimizer!r}")
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


def _build_now(model, optimizers, single):
    for o in optimizers:
        if not o.built and (single or o is getattr(model, "optimizer", None)):
            o.build(model.trainable_variables)
