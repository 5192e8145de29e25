"""The Keras 3 optimizer wrapper that puts a sync strategy into any optimizer.

Modelled on Keras's ``LossScaleOptimizer``: it holds an ``inner_optimizer``,
forwards ``learning_rate`` and ``iterations`` to it, and routes every way
Keras code applies gradients (``apply``, ``apply_gradients``, ``minimize``)
through the strategy's ``step``. No dynamic subclassing.

Initial state: every rank must start from the same weights and optimizer
state. ``hvd_easgd.broadcast_initial_state`` (or the ``BroadcastInitialState``
callback) broadcasts the model's variables and asks each optimizer to agree
on its own state; an optimizer not built yet (a GAN's, built at its first
``apply``, inside the trace) broadcasts its state when it is built. This
happens once per optimizer, not once per ``fit``. An optimizer built without
that compares a checksum of the initial weights across ranks and refuses to
train from different ones (``check_initial_state=False`` turns this off).

Mixed precision: Keras's ``LossScaleOptimizer`` belongs *inside*,
``DistributedOptimizer(LossScaleOptimizer(opt))``; ``scale_loss`` is passed
on to it, and the strategy hands it non-finite reduced gradients so that its
scale goes down on every rank. Outside, each rank would decide on an fp16
overflow alone, before the reduction, and a rank that skips its step would
leave the others waiting in the allreduce. ``broadcast_initial_state`` (and
so the ``BroadcastInitialState`` callback) rewires the layout Keras's
``compile`` builds for a ``mixed_float16`` model
(``LossScaleOptimizer(DistributedOptimizer)``) into the safe one; a
DistributedOptimizer still wrapped by a loss-scale optimizer when it is built
or applied refuses in one line (``loss_scale_layout_problem``).

Saving: ``save_own_variables``/``load_own_variables`` use the inner
optimizer's layout, and the training callbacks make the model's compile
config name the inner optimizer, so a ``model.save`` file loads with plain
Keras (no hvd_easgd needed). Strategy state (EASGD center, accumulators) is
not part of that file; ``hvd_easgd.checkpoint`` saves it.
"""
import warnings

import keras
import numpy as np
import tensorflow as tf
from keras.saving import deserialize_keras_object, register_keras_serializable, serialize_keras_object

from .. import validation
from ..comm import RanksDisagreeError
from ..startup.runtime import communicator as default_communicator
from ..strategies import SyncAverage
from ..strategies.base import gradient_sums, walk


def variable_signature(variables):
    """Shapes and dtypes, in order: what must agree across ranks for the
    grouped allreduce to line up."""
    return [[list(v.shape), str(v.dtype)] for v in variables]


def weights_checksum(variables):
    """Per variable, the float64 sum and sum of squares of its values: one
    number pair each, equal across ranks when the values are."""
    sums = []
    for v in variables:
        values = np.asarray(v.numpy(), dtype=np.float64)
        sums.append([float(values.sum()), float(np.square(values).sum())])
    return sums


@register_keras_serializable(package="hvd_easgd")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wraps a Keras 3 optimizer with a sync strategy.

    Args:
      optimizer: any Keras 3 optimizer (its learning-rate schedule included).
      strategy: a ``SyncStrategy``; default ``SyncAverage()``.
      comm: the communicator; default the one ``hvd_easgd.init()`` made.
      check_initial_state: when the optimizer is built without having
        agreed on its initial state (no ``broadcast_initial_state``), compare
        a checksum of the initial weights across ranks and raise if they
        differ. Turn it off when ranks legitimately start from different
        weights (per-rank state restored by hand).

    Example::

        hvd_easgd.init()
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                             strategy=hvd_easgd.EASGD(period=10))
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        model.fit(x, y, callbacks=hvd_easgd.callbacks.defaults(), verbose=hvd_easgd.rank() == 0)
    """

    def __init__(self, optimizer, strategy=None, comm=None, name=None, check_initial_state=True, **kwargs):
        if kwargs:
            raise ValueError("`**kwargs` must be empty: DistributedOptimizer takes no optimizer arguments of its own "
                             "(set them on the inner optimizer). Received: "
                             + ", ".join(f"{key}={value!r}" for key, value in sorted(kwargs.items())))
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"`optimizer` must be a Keras 3 optimizer. Received: optimizer={optimizer!r}")
        if getattr(optimizer, "gradient_accumulation_steps", None):
            raise ValueError("`optimizer` must not accumulate gradients itself, or they would accumulate twice: "
                             "use hvd_easgd.GradientAccumulation(k) instead. Received: "
                             f"optimizer.gradient_accumulation_steps={optimizer.gradient_accumulation_steps!r}")
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.strategy = strategy if strategy is not None else SyncAverage()
        self._comm = comm
        self._non_trainable_variables = []
        self.check_initial_state = bool(check_initial_state)
        # Whether build() checks, in a collective, that every rank builds the same
        # variables. Elastic mode (hvd_easgd/checkpoint/elastic.py) turns it off: a replacement
        # builds while the live ranks wait in another collective, and the same check
        # runs on every rank once the state is synchronised.
        self.check_ranks_at_build = True
        # True once every rank holds the same initial state (broadcast, or
        # restored): never re-broadcast after that, or a second fit would
        # reset EASGD's center and erase the other ranks' local weights.
        self.initial_state_synced = False
        # The rank to broadcast from when built, set by broadcast_initial_state
        # for an optimizer that builds later (at its first apply).
        self._sync_from_rank = None
        # True while a LossScaleOptimizer wraps this one (see __setattr__): unsafe.
        self.wrapped_by_loss_scale = False

    # --- wiring ------------------------------------------------------------------
    @property
    def comm(self):
        if self._comm is None:
            self._comm = default_communicator()
        return self._comm

    def attach(self, model):
        """Tells the optimizer about ``model``'s non-trainable state (handed to
        ``strategy.build``; BatchNorm statistics follow ``hvd_easgd.statistics``)
        and disables XLA for its step: Horovod's collectives are not
        XLA-compilable in a default build."""
        self._non_trainable_variables = list(model.non_trainable_variables)
        if getattr(model, "compiled", False):
            if model.jit_compile:
                warnings.warn("hvd_easgd: XLA (jit_compile) is turned off for the training step: "
                              "Horovod collectives cannot be XLA-compiled",
                              validation.ConfigurationWarning, stacklevel=2)
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
            self._refuse_unsafe_loss_scale_layout()
            var_list = list(var_list)
            self.inner_optimizer.build(var_list)
            syncing = self._sync_from_rank is not None
            checks = {"trainable_variables": variable_signature(var_list)}
            if self.check_initial_state and not syncing and not self.initial_state_synced:
                # Rides in the shape check's collective: no extra round trip.
                checks["weights_checksum"] = weights_checksum(var_list)
            try:
                if self.check_ranks_at_build:
                    self.comm.assert_same_across_ranks(
                        "the variables the optimizer reduces (a model built differently on some rank?)", checks)
            except RanksDisagreeError as err:
                if "`weights_checksum`" not in str(err):
                    raise
                raise RanksDisagreeError(
                    "the ranks start from different initial weights (their checksums differ), so they would "
                    "silently train different models. Call hvd_easgd.broadcast_initial_state(model, optimizer) "
                    "before the first step of a custom loop, or pass hvd_easgd.callbacks.defaults() to fit. "
                    "If the ranks' weights differ on purpose (per-rank state restored), pass "
                    "check_initial_state=False to DistributedOptimizer") from None
            self.strategy.bind(self.comm)
            self._connect_loss_scale()
            self.strategy.build(var_list, self._non_trainable_variables)
            super().build(var_list)
            if syncing:
                self._broadcast_own_state()

    def sync_initial_state(self, root_rank=0, trainable_variables=None):
        """Agrees with the other ranks on this optimizer's initial state, once.

        Built (or ``trainable_variables`` given): broadcasts its state from
        ``root_rank`` now; otherwise when it is built. Either way the strategy
        then takes its initial state from the synchronised weights (EASGD:
        x̃ ← x). The model's own variables must already agree (the caller
        broadcast them). A no-op once done.
        """
        if self.initial_state_synced:
            return
        self._sync_from_rank = root_rank
        if self.built:
            self._broadcast_own_state()
        elif trainable_variables is not None:
            self.build(list(trainable_variables))

    def _broadcast_own_state(self):
        with tf.init_scope():
            self.comm.broadcast_variables(self.variables, self._sync_from_rank)
            self.strategy.on_initial_state_synced()
        self.initial_state_synced = True
        self._sync_from_rank = None

    def __setattr__(self, name, value):
        # Keras's LossScaleOptimizer sets `loss_scale_factor` on the optimizer it
        # wraps (to turn off that one's own scaling): from inside, the one sign
        # that a loss-scale optimizer sits outside. Seen here, before Keras's
        # tracking drops an assignment of the value already held (None). Keras's
        # base __init__ sets it before inner_optimizer exists: not a wrapper.
        if name == "loss_scale_factor" and "inner_optimizer" in self.__dict__:
            super().__setattr__("wrapped_by_loss_scale", True)
        super().__setattr__(name, value)

    def loss_scale_layout_problem(self):
        """Why this optimizer's place among loss-scale optimizers is unsafe, or None.

        Returns:
          None for the safe layout, ``DistributedOptimizer(LossScaleOptimizer(opt))``
          (or no loss scaling). Otherwise the one-line message to raise: a
          LossScaleOptimizer outside decides on overflow per rank, before the
          reduction, so the job stalls the first time one rank overflows; one
          outside and one inside scale the loss twice.
        """
        if not self.wrapped_by_loss_scale:
            return None
        names, wrapped = [], self
        while isinstance(wrapped, keras.optimizers.Optimizer):
            names.append(type(wrapped).__name__)
            wrapped = getattr(wrapped, "inner_optimizer", None)
        received = f"Received: optimizer=LossScaleOptimizer({'('.join(names)}{')' * len(names)}"
        if isinstance(self.inner_optimizer, keras.optimizers.LossScaleOptimizer):
            return ("`optimizer` must hold one LossScaleOptimizer, inside the DistributedOptimizer: under "
                    "mixed_float16, compile wraps it in a second one (the loss would be scaled twice) unless "
                    f"you pass `auto_scale_loss=False` to compile. {received}")
        return ("`optimizer` must hold the LossScaleOptimizer inside the DistributedOptimizer, "
                "`DistributedOptimizer(LossScaleOptimizer(opt))`: outside, a rank whose gradients overflow "
                "skips the allreduce the other ranks wait in. For a compiled model, call "
                "hvd_easgd.broadcast_initial_state(model, opt) after compile, or pass hvd_easgd.callbacks.defaults() "
                f"to fit: either moves it inside. {received}")

    def _refuse_unsafe_loss_scale_layout(self):
        # At build and at every apply (once per trace in a tf.function; the outer
        # optimizer's cond traces this branch too), before any collective.
        problem = self.loss_scale_layout_problem()
        if problem is not None:
            raise ValueError(problem)

    def _connect_loss_scale(self):
        """Tells the strategies the inner LossScaleOptimizer's scale, if any."""
        inner = self.inner_optimizer
        loss_scale = None
        if isinstance(inner, keras.optimizers.LossScaleOptimizer):
            loss_scale = lambda: inner.dynamic_scale if inner.built else inner.initial_scale  # noqa: E731
        for strategy in walk(self.strategy):
            strategy.loss_scale = loss_scale

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
        # Built before a LossScaleOptimizer wrapped it (broadcast_initial_state before compile)?
        self._refuse_unsafe_loss_scale_layout()
        if not self.built:
            if trainable_variables is None:
                raise ValueError("`trainable_variables` must be given to the first apply() (it builds the optimizer). "
                                 "Received: trainable_variables=None")
            self.build(trainable_variables)
            self.built = True
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        if len(grads) != len(variables):
            raise ValueError(f"`grads` must hold one gradient per variable ({len(variables)} variables). "
                             f"Received: grads with {len(grads)} gradients")

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
                raise ValueError("`tape` must be given when `loss` is a tensor (a callable loss is differentiated "
                                 "under a tape of minimize's own). Received: tape=None")
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

    def scale_loss(self, loss):
        # Keras's train_step scales the loss through model.optimizer: without
        # this an inner LossScaleOptimizer would unscale gradients it never scaled.
        return self.inner_optimizer.scale_loss(loss)

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
            "check_initial_state": self.check_initial_state,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        strategy = deserialize_keras_object(config.pop("strategy"), custom_objects=custom_objects)
        return cls(inner, strategy=strategy, **config)

