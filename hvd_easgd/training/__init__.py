"""The optimizer wrapper and the model it trains: what a Keras training script calls.

    optimizer.py          DistributedOptimizer: a Keras 3 optimizer synchronised by a strategy
    model_optimizers.py   every DistributedOptimizer of a model (GANs)
    initial_state.py      broadcast_initial_state: rank 0's state everywhere, once per optimizer
    kept_model.py         the model you keep: KeptWeights, save_kept_model, merge_at_end
    sharding.py           shard_dataset: a user's tf.data pipeline, the same steps on every rank

Imports ``strategies``, ``startup``, ``comm`` and the top-level modules, nothing above them: the
callbacks and the application build on it.
"""
