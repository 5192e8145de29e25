"""Sharded evaluation with exact global metrics, two ranks played in one process.

Rank 1's evaluation runs first, through a communicator that records the
metric state it is asked to sum; rank 0's then runs through one that adds
that recorded state, as a real allreduce over two ranks would. Rank 0's
figures must equal one process's on the whole test set.
"""
import keras
import pytest
import tensorflow as tf

from hvd_easgd.app import data
from hvd_easgd.callbacks.global_metrics import GlobalEvaluationMetrics
from hvd_easgd.callbacks.metric_average import MetricAverage
from hvd_easgd.comm import LocalCommunicator
from hvd_easgd.comm.communicator import Communicator

pytestmark = pytest.mark.unit
BATCH = 60


class TwoRankCommunicator(Communicator):
    """Rank ``rank`` of two. A sum adds ``peer_sum`` (the other rank's tensors); an
    average returns ``tensors + 1`` so that a test can see what was averaged.
    Every call's inputs are kept in ``calls``."""

    size = 2

    def __init__(self, rank, peer_sum=None):
        super().__init__()
        self.rank = rank
        self.peer_sum = peer_sum
        self.calls = []

    def _grouped_allreduce(self, tensors, op):
        self.calls.append((op, [t.numpy() for t in tensors]))
        if op == "average":
            return [t + 1 for t in tensors]
        if self.peer_sum is None:
            return [tf.identity(t) for t in tensors]
        return [t + peer for t, peer in zip(tensors, self.peer_sum)]


@pytest.fixture(scope="module")
def uneven():
    """361 digits as the test set: rank 0 holds 181 (4 batches of 60, the last of 1), rank 1 180 (3 batches)."""
    digits = data.digits()
    return data.Dataset("uneven", digits.x_train, digits.y_train, digits.x_train[:361], digits.y_train[:361],
                        num_classes=10)


def compiled_model(metrics=("accuracy",)):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, "relu"),
                              keras.layers.Dense(10)])
    # lr 0: fit's training leaves the weights as they are, so its validation can be checked against evaluate
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=list(metrics))
    return model


def rank_one_state(model, dataset):
    """Rank 1's summed metric state: what the allreduce hands rank 0 as the peer's contribution."""
    shard = data.test_dataset(dataset, BATCH, rank=1, size=2)
    recorder = TwoRankCommunicator(rank=1)
    model.evaluate(shard, verbose=0, callbacks=[GlobalEvaluationMetrics(shard, recorder)])
    (op, state), = recorder.calls
    assert op == "sum"
    return state


def test_sharded_evaluate_gives_the_whole_test_sets_figures(uneven):
    model = compiled_model()
    whole = model.evaluate(data.test_dataset(uneven, BATCH), verbose=0, return_dict=True)
    shard = data.test_dataset(uneven, BATCH, rank=0, size=2)
    assert [len(shard), len(data.test_dataset(uneven, BATCH, rank=1, size=2))] == [4, 3]  # uneven batch counts
    own = model.evaluate(shard, verbose=0, return_dict=True)
    assert abs(own["loss"] - whole["loss"]) > 1e-4  # the shard alone is not the answer

    peer = rank_one_state(model, uneven)
    seen = {}

    class LogsAtTestEnd(keras.callbacks.Callback):
        def on_test_end(self, logs=None):
            seen.update(logs)

    comm = TwoRankCommunicator(rank=0, peer_sum=peer)
    exact = GlobalEvaluationMetrics(shard, comm)
    loss, accuracy = model.evaluate(shard, verbose=0, callbacks=[exact, LogsAtTestEnd()])
    assert loss == pytest.approx(whole["loss"], abs=1e-6)
    assert accuracy == pytest.approx(whole["accuracy"], abs=1e-6)
    assert seen == pytest.approx(whole, abs=1e-6)
    # the state summed: the loss tracker's and accuracy's (total, count), counts being the shard sizes
    (_, sent), = comm.calls
    assert [float(v) for v in sent[1::2]] == [181.0, 181.0] and [float(v) for v in peer[1::2]] == [180.0, 180.0]
    assert comm.account() == {"bytes": 0, "calls": 0}  # bookkeeping, not training traffic


def test_fit_validation_logs_are_exact_and_not_averaged_again(uneven):
    model = compiled_model()
    whole = model.evaluate(data.test_dataset(uneven, BATCH), verbose=0, return_dict=True)
    peer = rank_one_state(model, uneven)
    comm = TwoRankCommunicator(rank=0, peer_sum=peer)
    shard = data.test_dataset(uneven, BATCH, rank=0, size=2)
    train, _ = data.training_dataset(uneven, 32, seed=0, rank=0, size=2, start_epoch=0, epochs=1, steps=3)
    history = model.fit(train, epochs=1, steps_per_epoch=3, validation_data=shard, verbose=0,
                        callbacks=[GlobalEvaluationMetrics(shard, comm), MetricAverage(comm)])
    logs = {k: v[0] for k, v in history.history.items()}
    assert logs["val_loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert logs["val_accuracy"] == pytest.approx(whole["accuracy"], abs=1e-6)
    (sum_op, _), (average_op, averaged) = comm.calls
    assert (sum_op, average_op) == ("sum", "average")
    assert len(averaged[0]) == 2  # accuracy and loss; not the val_ entries
    assert logs["loss"] == pytest.approx(sorted(averaged[0])[1] + 1)  # MetricAverage's result reached History


class RunningMaximum(keras.metrics.Metric):
    """A metric whose state is not a sum: the largest logit seen."""

    def __init__(self, name="running_maximum"):
        super().__init__(name=name)
        self.maximum = self.add_variable(shape=(), initializer="zeros", name="maximum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.maximum.assign(keras.ops.maximum(self.maximum, keras.ops.max(y_pred)))

    def result(self):
        return self.maximum


def test_a_metric_whose_state_is_not_a_sum_is_refused_after_the_first_batch(uneven):
    model = compiled_model(metrics=["accuracy", RunningMaximum()])
    shard = data.test_dataset(uneven, BATCH, rank=0, size=2)
    batches = []

    class CountBatches(keras.callbacks.Callback):
        def on_test_batch_begin(self, batch, logs=None):
            batches.append(batch)

    with pytest.raises(ValueError, match=r"metric `running_maximum` \(RunningMaximum\) keeps a state that is not "
                                         r"a sum over samples.*additive_metrics=\[RunningMaximum\]"):
        model.evaluate(shard, verbose=0, callbacks=[GlobalEvaluationMetrics(shard, TwoRankCommunicator(0)),
                                                    CountBatches()])
    assert batches == [0]  # compile() builds the metrics in the first step
    # declared additive (it is not, but the user says so), or with one rank: accepted
    model.evaluate(shard, verbose=0, callbacks=[
        GlobalEvaluationMetrics(shard, TwoRankCommunicator(0), additive_metrics=[RunningMaximum])])
    model.evaluate(shard, verbose=0, callbacks=[GlobalEvaluationMetrics(shard, LocalCommunicator())])


def test_a_dataset_without_a_known_number_of_batches_is_refused():
    stream = tf.data.Dataset.from_generator(lambda: iter([]), output_signature=tf.TensorSpec((), tf.float32))
    with pytest.raises(ValueError, match="`dataset` must hold a known number of batches.*cardinality -2"):
        GlobalEvaluationMetrics(stream)


def test_evaluating_fewer_batches_than_the_dataset_holds_is_an_error(uneven):
    model = compiled_model()
    shard = data.test_dataset(uneven, BATCH, rank=0, size=2)
    with pytest.raises(RuntimeError, match="evaluation ran 2 batches on rank 0, but its dataset holds 4"):
        model.evaluate(shard, steps=2, verbose=0, callbacks=[GlobalEvaluationMetrics(shard, TwoRankCommunicator(0))])


def test_metric_average_averages_training_entries_only():
    comm = TwoRankCommunicator(rank=0)
    logs = {"loss": 0.5, "accuracy": 0.25, "val_loss": 0.75, "val_accuracy": 0.125}
    MetricAverage(comm).on_epoch_end(0, logs)
    assert logs == {"loss": 1.5, "accuracy": 1.25, "val_loss": 0.75, "val_accuracy": 0.125}
