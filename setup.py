"""Installs the hvd_easgd package.

``pip install .`` declares what hvd_easgd runs on, as ranges, so it installs
into a user's own supported TensorFlow; ``requirements.txt`` keeps the exact
pins the project tests together (``make setup``), and ``tools/tf_versions.txt``
lists the TensorFlow versions tried.

Horovod is built from source by ``tools/setup_env.sh`` (``make setup``)
because it must be compiled against the exact TensorFlow in the environment;
it is therefore not an install requirement here (its runtime needs are).
"""
import os
import shutil

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# The supported TensorFlow: 2.18.1 up to the 2.21 series (tools/tf_versions.txt).
TENSORFLOW_RANGE = ">=2.18.1,<2.22"


def _cuda_present():
    return shutil.which("nvidia-smi") is not None and not os.environ.get("HVD_EASGD_FORCE_CPU")


def requirements(cuda=None):
    """The install requirements; the TF distribution is chosen as tools/setup_env.sh
    chooses it (``tensorflow[and-cuda]`` where CUDA is present)."""
    cuda = _cuda_present() if cuda is None else cuda
    tensorflow = "tensorflow[and-cuda]" if cuda else "tensorflow-cpu"
    return [
        tensorflow + TENSORFLOW_RANGE,
        "keras>=3.10,<4",
        # TF >= 2.21 no longer brings it; tf.summary (train.py's logs) needs it.
        "tensorboard>=2.18",
        "numpy>=1.26",
        "mpi4py>=4.0",
        "scikit-learn>=1.3",
        "pyyaml>=6.0",
        # Horovod's runtime needs (tools/setup_env.sh installs its wheel with --no-deps).
        "cloudpickle>=2.0",
        "psutil>=5.9",
        "packaging>=23",
        "cffi>=1.15",
    ]


def _version():
    with open(os.path.join(HERE, "hvd_easgd", "version.py")) as f:
        scope = {}
        exec(f.read(), scope)
        return scope["__version__"]


if __name__ == "__main__":
    setup(
        name="hvd_easgd",
        version=_version(),
        description="Pluggable sync strategies (SyncAverage, EASGD, gradient accumulation, local SGD, DiLoCo, "
        "Hierarchical) for TensorFlow 2 / Keras 3 over ring-allreduce",
        packages=find_packages(include=["hvd_easgd", "hvd_easgd.*"]),
        # The mpi-direct ops are compiled on each machine (make setup) from their source.
        package_data={"hvd_easgd.comm._mpi_ops": ["*.cc"]},
        python_requires=">=3.11,<3.12",
        install_requires=requirements(),
    )
