"""The model two studies' workers train (``agreement_cost``, ``elastic_trial``): train.py's default model and
data, the digits CNN under SyncAverage, compiled as train.py compiles it (SGD with momentum 0.9, cross-entropy
from logits, accuracy, no XLA), its weights from seed 1.

Keras and the library are imported when the model is built, in a worker: a study's driver never imports
TensorFlow.
"""


def sync_average_cnn(comm, learning_rate):
    """``(data, model, optimizer)``: the digits data, the compiled CNN, and its ``DistributedOptimizer``
    (SyncAverage over ``comm``, SGD at ``learning_rate``)."""
    import keras

    from hvd_easgd import DistributedOptimizer, SyncAverage
    from hvd_easgd.app.data import digits
    from hvd_easgd.app.models import cnn

    data = digits()
    keras.utils.set_random_seed(1)
    model = cnn(data.input_shape, data.num_classes)
    optimizer = DistributedOptimizer(keras.optimizers.SGD(learning_rate, momentum=0.9), strategy=SyncAverage(),
                                     comm=comm)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return data, model, optimizer
