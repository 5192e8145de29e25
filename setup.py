"""Installs the hvd_easgd package, and its command ``hvd-easgd``.

``pip install`` (the wheel or sdist from ``make dist``, or a clone) declares
what hvd_easgd runs on, as ranges, so it installs into a user's own venv that
already has a supported TensorFlow. TensorFlow itself is an extra, because its
distribution's name varies (``tensorflow``, ``tensorflow-cpu``, ...) and a
requirement on one would install it beside another: ``hvd_easgd[cpu]`` brings
``tensorflow-cpu``, ``hvd_easgd[cuda]`` ``tensorflow[and-cuda]``.
``requirements.txt`` keeps the exact pins the project tests together
(``make setup``), and ``hvd_easgd/install/tf_versions.txt`` lists the
TensorFlow versions tried.

Horovod and the direct MPI ops are compiled against the exact TensorFlow and
MPI in the environment, so they are not install requirements here (Horovod's
runtime needs are): ``hvd-easgd setup`` builds them after ``pip install``
(``make setup`` runs it too). Its patch and version list ship as package data.
"""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# The supported TensorFlow: 2.18.1 up to the 2.21 series (hvd_easgd/install/tf_versions.txt).
TENSORFLOW_RANGE = ">=2.18.1,<2.22"
# The TensorFlow distribution for each variant, as `hvd-easgd setup` names the variants
# (tools/setup_env.sh installs the same one into the repository's venv).
TENSORFLOW_EXTRAS = {"cpu": ["tensorflow-cpu" + TENSORFLOW_RANGE], "cuda": ["tensorflow[and-cuda]" + TENSORFLOW_RANGE]}


def requirements():
    """The install requirements: everything hvd_easgd imports but TensorFlow (``TENSORFLOW_EXTRAS``)."""
    return [
        "keras>=3.10,<4",
        # TF >= 2.21 no longer brings it; tf.summary (train.py's logs) needs it.
        "tensorboard>=2.18",
        "numpy>=1.26",
        "mpi4py>=4.0",
        "scikit-learn>=1.3",
        "pyyaml>=6.0",
        # Horovod's runtime needs (`hvd-easgd setup` installs its wheel with --no-deps).
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
        # Compiled or applied on each machine by `hvd-easgd setup`: the mpi-direct ops' source,
        # hvd_easgd's patch to Horovod, and the TensorFlow versions it supports.
        package_data={"hvd_easgd.comm._mpi_ops": ["*.cc"], "hvd_easgd.install": ["*.patch", "tf_versions.txt"]},
        entry_points={"console_scripts": ["hvd-easgd = hvd_easgd.install.cli:main"]},
        python_requires=">=3.11,<3.12",
        install_requires=requirements(),
        extras_require=TENSORFLOW_EXTRAS,
    )
