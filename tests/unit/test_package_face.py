"""The package face: `import hvd_easgd.x` loads x and what x needs, nothing more."""
import subprocess

import pytest

import hvd_easgd
from tests.helpers import PYTHON, ROOT, quiet_env

pytestmark = pytest.mark.unit


def test_slurm_helpers_load_without_tensorflow_or_keras():
    # the sbatch templates call `python -m hvd_easgd.startup.slurm` before any training starts:
    # it promises the standard library only, and TensorFlow costs seconds to load
    code = ("import sys, hvd_easgd.startup.slurm; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod', 'numpy') if m in sys.modules))")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_every_public_name_resolves_and_is_listed():
    for name in hvd_easgd.__all__:
        assert getattr(hvd_easgd, name) is not None, name
    assert set(hvd_easgd.__all__) <= set(dir(hvd_easgd))
    assert hvd_easgd.EASGD is hvd_easgd.strategies.EASGD
    assert hvd_easgd.init is hvd_easgd.startup.runtime.init
    with pytest.raises(AttributeError, match="module 'hvd_easgd' has no attribute 'Nope'"):
        hvd_easgd.Nope  # noqa: B018
