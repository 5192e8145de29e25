"""The version switches in hvd_easgd/_compat.py that need no TensorFlow import."""
import pytest

from hvd_easgd import _compat
from tests.helpers import ROOT

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("tf_version, wanted", [("2.18.1", "tf_keras==2.18.0"), ("2.19.1", "tf_keras==2.19.0"),
                                                ("2.20.0", "tf_keras==2.20.1"), ("2.21.0", "tf_keras==2.21.0")])
def test_the_mwms_baseline_gets_the_keras_2_of_the_running_tf_series(tf_version, wanted):
    assert _compat.tf_keras_requirement(tf_version) == wanted


def test_a_tf_series_without_a_known_tf_keras_is_refused_by_name():
    with pytest.raises(ValueError, match=r"no tf_keras is known for TensorFlow 2\.17\.0.*Received: "
                                         r"tensorflow_version='2\.17\.0'"):
        _compat.tf_keras_requirement("2.17.0")


def test_the_installed_tensorflow_is_read_without_importing_it():
    import sys

    imported_before = "tensorflow" in sys.modules
    version = _compat.installed_tensorflow_version()
    assert version is not None and version.count(".") == 2
    assert ("tensorflow" in sys.modules) == imported_before
    import tensorflow as tf

    assert version == tf.__version__


@pytest.mark.slow  # a fresh interpreter that imports TensorFlow
def test_train_pys_ranks_load_keras_without_matplotlib_or_sklearn_and_can_still_import_them():
    import subprocess
    import sys

    code = ("import sys; import train; "
            "assert 'keras' in sys.modules and 'matplotlib' not in sys.modules, 'matplotlib was imported'; "
            "assert 'sklearn' not in sys.modules, 'sklearn was imported'; "
            "import keras.src.visualization.plot_image_gallery as gallery; assert gallery.plt is None; "
            "import keras.src.wrappers.sklearn_wrapper as wrapper; assert wrapper.sklearn is None; "
            "import matplotlib.pyplot; assert sys.modules['matplotlib'] is not None; "
            "from sklearn.datasets import load_digits; assert load_digits().data.shape == (1797, 64)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow  # a fresh interpreter that imports TensorFlow
def test_a_users_script_reaching_the_apps_modules_keeps_keras_galleries():
    """docs/keras.md's scripts call hvd_easgd.data: importing it hides nothing."""
    import subprocess
    import sys

    code = ("import hvd_easgd; hvd_easgd.data; "
            "import keras.src.visualization.plot_image_gallery as gallery; "
            "assert gallery.plt is not None, 'matplotlib was hidden from Keras'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_nothing_is_hidden_once_tensorflow_is_loaded():
    import sys

    import tensorflow  # noqa: F401

    before = {name: sys.modules.get(name, "absent") for name in ("matplotlib", "sklearn")}
    _compat.import_keras_for_ranks()
    assert {name: sys.modules.get(name, "absent") for name in before} == before
