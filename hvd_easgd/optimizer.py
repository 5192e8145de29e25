"""The Keras 3 optimizer wrapper that puts a sync strategy into any optimizer.

Modelled on Keras's ``LossScaleOptimizer``: it holds an ``inner_optimizer``,
forwards ``learning_rate`` and ``iterations`` to it, and routes every way
Keras code applies gradients (``apply``, ``apply_gradients``, ``minimize``)
through the strategy's ``step``. No dynamic subclassing.

Saving: ``save_own_variables``/``load_own_variables`` use the inner
optimizer's layout, and the training callbacks make the model's compile
config name the inner optimizer, so a ``model.save`` file loads with plain
Keras (no hvd_easgd needed). Strategy state (EASGD center, accumulators) is
not part of that file; ``hvd_easgd.checkpoint`` saves it.
"""
import warnings

import keras
import tensorflow as tf
from keras.saving import deserialize_keras_object, register_keras_serializable, serialize_keras_object

from .runtime import communicator as default_communicator
from .strategies import SyncAverage
from .strategies.base import gradient_sums


def variable_signature(variables):
    """Shapes and dtypes, in order: what must agree across ranks for the
    grouped allreduce to line up."""
    return [[list(v.shape), str(v.dtype)] for v in variables]


@register_keras_serializable(package="hvd_easgd")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wraps a Keras 3 optimizer with a sync strategy.

    Args:
      optimizer: any Keras 3 optimizer (its learning-rate schedule included).
      strategy: a ``SyncStrategy``; default ``SyncAverage()``.
      comm: the communicator; default the one ``hvd_easgd.init()`` made.

    Example::

        hvd_easgd.init()
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                             strategy=hvd_easgd.EASGD(communication_period=10))
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        model.fit(x, y, callbacks=hvd_easgd.callbacks.defaults(), verbose=hvd_easgd.rank() == 0)
    """

    def __init__(self, optimizer, strategy=None, comm=None, name=None, **kwargs):
        if kwargs:
            raise ValueError(f"DistributedOptimizer does not support arguments: {sorted(kwargs)}; "
                             "set them on the inner optimizer")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"`optimizer` must be a Keras 3 optimizer. Received: optimizer={optimizer!r}")
        if getattr(optimizer, "gradient_accumulation_steps", None):
            raise ValueError("the inner optimizer has `gradient_accumulation_steps="
                             f"{optimizer.gradient_accumulation_steps}`: it would accumulate twice. "
                             "Use hvd_easgd.GradientAccumulation(k) instead")
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.strategy = strategy if strategy is not None else SyncAverage()
        self._comm = comm
        self._non_trainable_variables = []

    # --- wiring ------------------------------------------------------------------
    @property
    def comm(self):
        if self._comm is None:
            self._comm = default_communicator()
        return self._comm

    def attach(self, model):
        """Tells the optimizer about ``model``'s non-trainable state (which
        EASGD averages) and disables XLA for its step: Horovod's collectives
        are not XLA-compilable in a default build."""
        self._non_trainable_variables = list(model.non_trainable_variables)
        if getattr(model, "compiled", False):
            if model.jit_compile:
                warnings.warn("hvd_easgd: XLA (jit_compile) is turned off for the training step: "
                              "Horovod collectives cannot be XLA-compiled", stacklevel=2)
                model.jit_compile = False
                if model.train_function is not None:
                    model.make_train_function(force=True)
            # model.save then writes the inner optimizer: loadable with plain Keras.
            compile_config = getattr(model, "_compile_config", None)
            if compile_config is not None and compile_config.config.get("optimizer") is self:
                compile_config.config["optimizer"] = self.inner_optimizer

    @tf.autograph.experimental.do_not_convert
    def build(self, var_list):
        # Called eagerly or, on first apply, while tracing: init_scope lifts
        # variable creation and the cross-rank check out of the trace.
        with tf.init_scope():
            var_list = list(var_list)
            self.inner_optimizer.build(var_list)
            self.comm.assert_same_across_ranks(
                "the variables the optimizer reduces (a model built differently on some rank?)",
                {"trainable_variables": variable_signature(var_list)},
            )
            self.strategy.bind(self.comm)
            self.strategy.build(var_list, self._non_trainable_variables)
            super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    # --- applying gradients ------------------------------------------------------------
    def apply(self, grads, trainable_variables=None, sample_count=None):
        """Runs one strategy step.

        Args:
          grads: the gradient of the loss averaged over the ``sample_count``
            samples of this call (what a Keras loss gives), one per variable.
          trainable_variables: the variables (required on the first call).
          sample_count: n, the number of samples ``grads`` average over, or
            None (default): weight 1 per call, grads taken as they are.

        Every strategy then applies the same thing. ``SyncAverage`` applies
        the per-sample mean over all ranks, Σ_r n_r g_r / Σ_r n_r (the plain
        mean over ranks when the count is None); ``EASGD``'s local step
        applies g; ``GradientAccumulation`` applies Σ_j n_j g_j / Σ_j n_j over
        its window (and ranks, under SyncAverage), so k micro-batches of b
        samples equal one batch of k·b. ``sample_count=0`` marks a rank with
        no data this call: it contributes nothing, even if its mean is NaN.
        """
        grads = list(grads)
        if not self.built:
            if trainable_variables is None:
                raise ValueError("the first apply() must pass trainable_variables")
            self.build(trainable_variables)
            self.built = True
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")

        def apply_update(reduced):
            self.inner_optimizer.apply(list(reduced), variables)

        # The one place the public contract (means) becomes the strategies' (sums).
        grad_sums, count = gradient_sums(grads, variables, sample_count)
        self.strategy.step(grad_sums, variables, apply_update, sample_count=count)
        return self.iterations

    def apply_gradients(self, grads_and_vars, sample_count=None):
        """``apply`` on ``(grad, variable)`` pairs; ``sample_count`` as there."""
        grads, variables = zip(*grads_and_vars)
        return self.apply(grads, variables, sample_count=sample_count)

    def minimize(self, loss, var_list, tape=None, sample_count=None):
        """tf.keras-style: ``loss`` is a callable, or a tensor computed under
        ``tape``; a mean over ``sample_count`` samples as in ``apply``."""
        var_list = list(var_list)
        if tape is None:
            if not callable(loss):
                raise ValueError("`tape` is required when `loss` is a tensor")
            with tf.GradientTape() as tape:
                loss_value = loss()
        else:
            loss_value = loss
        grads = tape.gradient(loss_value, var_list)
        return self.apply(grads, var_list, sample_count=sample_count)

    # --- delegation to the inner optimizer ------------------------------------------------
    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        # Keras's base __init__ sets learning_rate before inner_optimizer exists.
        if "inner_optimizer" in self.__dict__:
            self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def save_own_variables(self, store):
        self.inner_optimizer.save_own_variables(store)

    def load_own_variables(self, store):
        self.inner_optimizer.load_own_variables(store)

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": serialize_keras_object(self.inner_optimizer),
            "strategy": serialize_keras_object(self.strategy),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        strategy = deserialize_keras_object(config.pop("strategy"), custom_objects=custom_objects)
        return cls(inner, strategy=strategy, **config)


def broadcast_initial_state(model, optimizer, root_rank=0):
    """Gives every rank rank ``root_rank``'s weights and optimizer state.

    Call once before the first step of a custom loop (the
    ``BroadcastInitialState`` callback does it for ``model.fit``). Builds the
    optimizer and the strategy, then lets the strategy take its initial state
    (EASGD: x̃ ← x) from the synchronised weights.
    """
    comm = optimizer.comm
    # Checked before any broadcast: ranks with different variable lists would
    # otherwise wait in broadcasts the others never issue.
    comm.assert_same_across_ranks("the model's variables (a model built differently on some rank?)",
                                  {"model_variables": variable_signature(model.variables)})
    if isinstance(optimizer, DistributedOptimizer):
        optimizer.attach(model)
    comm.broadcast_variables(model.variables, root_rank)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    comm.broadcast_variables(optimizer.variables, root_rank)
    if isinstance(optimizer, DistributedOptimizer):
        optimizer.strategy.on_initial_state_synced()
