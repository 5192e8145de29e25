"""SyncAverage against raw Horovod through ``model.fit`` (what most users call).

Both use Keras's own ``train_step`` with ``steps_per_execution`` (a
``tf.while_loop`` over steps inside one ``tf.function``); they differ only in
the optimizer: hvd_easgd's ``DistributedOptimizer(SyncAverage)`` or an SGD
whose ``apply`` first calls ``hvd.grouped_allreduce`` itself.

A fit is timed from the end of its first execution to the end of the epoch:
tracing, the data iterator's start-up and the ranks' staggered arrival all
fall before the clock starts, and the first collective lines the ranks up.
"""
import time

import keras
import tensorflow as tf

import hvd_easgd

from .collective_count import CollectiveCounter, TrafficAccount
from .configurations import broadcast_like_raw_horovod, expected_for_launch, lookup
from .names import FIT


class RawAllreduceSGD(keras.optimizers.SGD):
    """SGD that averages the gradients with one ``hvd.grouped_allreduce`` first."""

    def apply(self, grads, trainable_variables=None):
        import horovod.tensorflow as hvd

        return super().apply(hvd.grouped_allreduce(list(grads), op=hvd.Average), trainable_variables)


class _WindowTimer(keras.callbacks.Callback):
    def __init__(self, on_start):
        super().__init__()
        self._on_start = on_start
        self.started = None
        self.seconds = None

    def on_epoch_begin(self, epoch, logs=None):
        self.started = None

    def on_train_batch_end(self, batch, logs=None):
        if self.started is None:  # the first execution just finished
            self._on_start()
            self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.started


class FitConfiguration:
    def __init__(self, name, model_name, input_shape, num_classes, batch, comm, steps_per_execution,
                 lr=0.05, seed=0):
        self.name = name
        self.comm = comm
        self.steps_per_execution = steps_per_execution
        keras.utils.set_random_seed(seed)
        self.model = hvd_easgd.models.build(model_name, input_shape, num_classes)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if name not in FIT:
            raise ValueError(f"unknown fit configuration {name!r}; choose from {FIT}")
        row = lookup(name)
        if not row.is_baseline:
            self.optimizer = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9),
                                                            strategy=row.make_strategy(), comm=comm)
        else:  # raw Horovod, the only fit baseline
            self.optimizer = RawAllreduceSGD(lr, momentum=0.9)
        self.model.compile(optimizer=self.optimizer, loss=loss, steps_per_execution=steps_per_execution,
                           jit_compile=False)
        if not row.is_baseline:
            hvd_easgd.broadcast_initial_state(self.model, self.optimizer)
            self.traffic = TrafficAccount(comm)
        else:
            broadcast_like_raw_horovod(self.model)
            # Raw Horovod keeps no account: its collectives are counted where Keras traces them.
            self.traffic = TrafficAccount(comm, CollectiveCounter())

    def fit_once(self, dataset, steps):
        """One epoch of ``steps`` steps; returns (seconds, timed steps)."""
        timer = _WindowTimer(self.reset_account)
        with self.traffic.tracing():
            self.model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer], shuffle=False)
        return timer.seconds, steps - self.steps_per_execution

    def reset_account(self):
        self.traffic.reset()

    def account(self):
        return self.traffic.account()


def dataset(x, y, batch):
    """This rank's pre-sharded samples, batched, repeated (one pass per fit)."""
    return (tf.data.Dataset.from_tensor_slices((x.reshape(-1, *x.shape[2:]), y.reshape(-1)))
            .batch(batch, drop_remainder=True).repeat().prefetch(4))


def expected_traffic(config):
    """What a model.fit row is expected to send per step: its table row's strategy's
    traffic (or, for raw Horovod, that of the strategy it sends like)."""
    return expected_for_launch(config.name, config.model, config.comm)

