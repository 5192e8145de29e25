"""Evaluates on the EASGD center: swaps x̃ in for evaluation, and back out after."""
import keras


def center_strategy(optimizer):
    """The EASGD strategy inside ``optimizer`` (possibly under accumulation), or None."""
    strategy = getattr(optimizer, "strategy", None)
    while strategy is not None and not hasattr(strategy, "center"):
        strategy = getattr(strategy, "strategy", None)
    return strategy


class SwappedWeights:
    """Context manager: the model's trainable weights hold the center inside the block."""

    def __init__(self, strategy):
        self.strategy = strategy
        self._saved = None

    def __enter__(self):
        self._saved = [v.numpy() for v in self.strategy.variables]
        for v, c in zip(self.strategy.variables, self.strategy.center):
            v.assign(c)
        return self

    def __exit__(self, *exc):
        for v, saved in zip(self.strategy.variables, self._saved):
            v.assign(saved)
        self._saved = None
        return False


class CenterSwap(keras.callbacks.Callback):
    """For EASGD, ``evaluate`` and ``fit``'s validation run on the center x̃
    (the model users keep); the local weights are restored afterwards. A no-op
    for strategies without a center."""

    def __init__(self):
        super().__init__()
        self._swap = None

    def on_test_begin(self, logs=None):
        strategy = center_strategy(self.model.optimizer)
        if strategy is not None and strategy.built:
            self._swap = SwappedWeights(strategy).__enter__()

    def on_test_end(self, logs=None):
        if self._swap is not None:
            self._swap.__exit__(None, None, None)
            self._swap = None
