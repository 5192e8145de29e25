"""Stops training after too many consecutive steps with NaN/Inf updates."""
import keras


class NonFiniteTrainingError(RuntimeError):
    pass


class AbortOnNonFinite(keras.callbacks.Callback):
    """Strategies skip non-finite updates and count them; this turns a run of
    ``max_consecutive`` skipped steps into a clear error. Every rank reads the
    same counter for SyncAverage; for EASGD a rank stops on its own counter
    and the launcher ends the others."""

    def __init__(self, max_consecutive=25, check_every=10):
        super().__init__()
        self.max_consecutive = max_consecutive
        self.check_every = check_every

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.check_every:
            return
        strategy = getattr(self.model.optimizer, "strategy", None)
        if strategy is None or not strategy.built:
            return
        run = max(int(s.consecutive_skips.numpy()) for s in _strategies(strategy))
        if run >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f"{run} consecutive optimizer steps had NaN/Inf gradients and were skipped "
                f"(limit --max-bad-steps={self.max_consecutive}); lower the learning rate or check the data")


def _strategies(strategy):
    while strategy is not None:
        if strategy.built:
            yield strategy
        strategy = getattr(strategy, "strategy", None)
