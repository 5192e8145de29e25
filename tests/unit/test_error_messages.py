"""Bad input to the library is refused in one form, Keras's: "`name` must be ... Received: name=value"."""
import keras
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, LocalCommunicator
from hvd_easgd.startup import runtime
from hvd_easgd.training import sharding
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies import registry

pytestmark = pytest.mark.unit


def test_the_distributed_optimizer_refuses_in_keras_form():
    with pytest.raises(ValueError, match=r"^`\*\*kwargs` must be empty: .* on the inner optimizer\)\. "
                                         r"Received: learning_rate=0\.1$"):
        hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(), learning_rate=0.1)
    with pytest.raises(TypeError, match=r"^`optimizer` must be a Keras 3 optimizer\. Received: optimizer='sgd'$"):
        hvd_easgd.DistributedOptimizer("sgd")
    with pytest.raises(ValueError, match=r"^`optimizer` must not accumulate gradients itself, or they would "
                                         r"accumulate twice: .* Received: optimizer\.gradient_accumulation_steps=2$"):
        hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2))
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(), comm=LocalCommunicator())
    w = tf.Variable([0.0])
    with pytest.raises(ValueError, match=r"^`trainable_variables` must be given to the first apply\(\) .* "
                                         r"Received: trainable_variables=None$"):
        opt.apply([tf.constant([1.0])])
    with pytest.raises(ValueError, match=r"^`grads` must hold one gradient per variable \(1 variables\)\. "
                                         r"Received: grads with 2 gradients$"):
        opt.apply([tf.constant([1.0])] * 2, [w])
    with pytest.raises(ValueError, match=r"^`tape` must be given when `loss` is a tensor .* Received: tape=None$"):
        opt.minimize(tf.constant(1.0), [w])


def test_the_registry_and_the_runtime_refuse_in_keras_form():
    with pytest.raises(ValueError, match=r"^`name` must be one no registered strategy has \('easgd' is already "
                                         r"registered, by hvd_easgd\.strategies\.easgd\.EASGD\)\. "
                                         r"Received: name='easgd'$"):
        registry.register(hvd_easgd.EASGD)
    with pytest.raises(ValueError, match=r"^`collectives` must be \"auto\" or \"horovod\" under a Gloo launch "
                                         r"\(horovodrun --gloo\): mpi-direct needs an MPI launch \(horovodrun --mpi, "
                                         r"mpirun, srun --mpi=pmix\)\. Received: collectives='mpi-direct'$"):
        runtime.check_collectives("mpi-direct", {"HOROVOD_CONTROLLER": "gloo"})


def test_diloco_and_sharding_refuse_in_keras_form():
    with pytest.raises(ValueError, match=r"^`outer_learning_rate` and `outer_momentum` must keep their defaults when "
                                         r"`outer_optimizer` is given: .* Received: outer_learning_rate=0\.5, "):
        DiLoCo(outer_learning_rate=0.5, outer_optimizer=keras.optimizers.SGD())
    outer = keras.optimizers.SGD()
    outer.build([tf.Variable([0.0])])
    with pytest.raises(ValueError, match=r"^`outer_optimizer` must not be built yet \(used elsewhere\?\): each DiLoCo "
                                         r"needs its own\. Received: outer_optimizer="):
        DiLoCo(outer_optimizer=outer).build([tf.Variable([0.0])])
    cluster = SimulatedCluster(3)
    with pytest.raises(ValueError, match=r"^`dataset` must hold at least one element per rank \(3 ranks\), or some "
                                         r"rank would get none\. Received: dataset=.* \(0 elements for the shortest "
                                         r"rank\)$"):
        sharding.shard_dataset(tf.data.Dataset.range(2), comm=cluster.communicators[0])
