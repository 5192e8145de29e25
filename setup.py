"""Installs the hvd_easgd package. The stack is pinned in requirements.txt.

Horovod is built from source by ``tools/setup_env.sh`` (``make setup``) because
it must be compiled against the exact TensorFlow in the environment; it is
therefore not an install requirement here.
"""
import os
import shutil

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _cuda_present():
    return shutil.which("nvidia-smi") is not None and not os.environ.get("HVD_EASGD_FORCE_CPU")


def _requirements():
    reqs = []
    with open(os.path.join(HERE, "requirements.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("horovod"):
                continue
            if line.startswith("tensorflow-cpu==") and _cuda_present():
                line = "tensorflow[and-cuda]==" + line.split("==", 1)[1]
            reqs.append(line)
    return reqs


def _version():
    with open(os.path.join(HERE, "hvd_easgd", "version.py")) as f:
        scope = {}
        exec(f.read(), scope)
        return scope["__version__"]


setup(
    name="hvd_easgd",
    version=_version(),
    description="Pluggable sync strategies (SyncAverage, EASGD, gradient accumulation) "
    "for TensorFlow 2 / Keras 3 over Horovod ring-allreduce",
    packages=find_packages(include=["hvd_easgd", "hvd_easgd.*"]),
    # The mpi-direct ops are compiled on each machine (make setup) from their source.
    package_data={"hvd_easgd.comm._mpi_ops": ["*.cc"]},
    python_requires=">=3.11,<3.12",
    install_requires=_requirements(),
)
