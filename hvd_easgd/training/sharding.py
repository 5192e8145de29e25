"""Shards a user's own ``tf.data`` pipeline across ranks, with the same number of steps on every rank.

``model.fit`` on a pipeline that each rank shards by itself
(``dataset.shard(size, rank)``) gives ranks that differ by one element when
the length is not a multiple of the number of ranks. The rank with one batch
more then waits in an allreduce the others never issue, and Horovod's stall
inspector kills the job after 60 s. ``shard_dataset`` cuts every shard to the
shortest one's length.

Example::

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = hvd_easgd.shard_dataset(ds)          # before shuffle/batch: shard samples
    ds = ds.shuffle(10_000, seed=1).batch(64)
    model.fit(ds, epochs=5, callbacks=hvd_easgd.callbacks.defaults())
"""
import tensorflow as tf


def shard_dataset(dataset, comm=None):
    """This rank's ``1/size`` of ``dataset``, with equally many elements on every rank.

    Args:
      dataset: a finite ``tf.data.Dataset`` (samples, or batches); an infinite
        one (``.repeat()``) is sharded as is, and ``fit`` then needs the same
        ``steps_per_epoch`` on every rank.
      comm: the communicator; default the one ``hvd_easgd.init()`` made.

    Returns:
      ``dataset.shard(size, rank).take(n)``, where n is the length of the
      shortest shard. At most ``size - 1`` elements are left out per pass.
      When the length is unknown to ``tf.data`` (after a ``filter``), each
      rank counts its shard once, and the counts are exchanged.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"`dataset` must be a tf.data.Dataset. Received: dataset={dataset!r}")
    if comm is None:
        from ..startup.runtime import communicator

        comm = communicator()
    if comm.size == 1:
        return dataset
    shard = dataset.shard(comm.size, comm.rank)
    length = int(dataset.cardinality())
    if length == tf.data.INFINITE_CARDINALITY:
        return shard
    if length == tf.data.UNKNOWN_CARDINALITY:
        mine = int(shard.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
        shortest = min(comm.allgather_json(mine))
    else:
        shortest = length // comm.size
    if shortest < 1:
        raise ValueError(f"`dataset` must hold at least one element per rank ({comm.size} ranks), or some rank "
                         f"would get none. Received: dataset={dataset!r} ({shortest} elements for the shortest rank)")
    return shard.take(shortest)
