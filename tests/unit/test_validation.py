"""hvd_easgd.validation: the one set of argument checks, each in Keras's message form, and the
warnings about arguments every rank shares, said by rank 0 alone."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from hvd_easgd import validation

pytestmark = pytest.mark.unit


def test_integers_are_integers_and_never_bools():
    assert validation.is_integer(3) and validation.is_integer(np.int32(3))
    assert not validation.is_integer(True) and not validation.is_integer(3.0) and not validation.is_integer("3")
    assert validation.is_number(2.5) and validation.is_number(np.float32(2.5)) and validation.is_number(2)
    assert not validation.is_number(False) and not validation.is_number("2.5") and not validation.is_number(None)


def test_integer_returns_a_python_int_or_refuses_in_keras_form():
    value = validation.integer("k", np.int64(4), minimum=1)
    assert value == 4 and type(value) is int
    assert validation.integer("n", None, minimum=1, allow_none=True) is None
    for bad in (0, True, 2.0, "3", None):
        with pytest.raises(ValueError, match=rf"^`k` must be an integer >= 1\. Received: k={bad!r}$"):
            validation.integer("k", bad, minimum=1)
    with pytest.raises(ValueError, match=r"^`n` must be an integer with 1 <= n <= 3, or None\. Received: n=4$"):
        validation.integer("n", 4, minimum=1, maximum=3, allow_none=True, condition=", or None")
    with pytest.raises(ValueError, match=r"^`tau` \(steps\) must be an integer >= 1\. Received: tau=0$"):
        validation.integer("tau", 0, minimum=1, gloss="(steps)")


def test_number_returns_a_python_float_or_refuses_in_keras_form():
    value = validation.number("rho", np.float32(0.5), minimum=0)
    assert value == 0.5 and type(value) is float
    assert validation.number("rho", 0, minimum=0) == 0.0
    with pytest.raises(ValueError, match=r"^`lr` must be a number > 0\. Received: lr=0$"):
        validation.number("lr", 0, minimum=0, min_inclusive=False)
    with pytest.raises(ValueError, match=r"^`mu` must be a number with 0 <= mu < 1\. Received: mu=1\.0$"):
        validation.number("mu", 1.0, minimum=0, maximum=1, max_inclusive=False)
    for bad in (True, "1", float("nan")):
        with pytest.raises(ValueError, match=r"^`x` must be a number >= 0\. Received: x="):
            validation.number("x", bad, minimum=0)
    assert validation.number("x", None, allow_none=True) is None


def test_one_of_and_refusal():
    assert validation.one_of("op", "sum", ("sum", "average")) == "sum"
    with pytest.raises(ValueError, match=r"^`op` must be one of \('sum', 'average'\)\. Received: op='max'$"):
        validation.one_of("op", "max", ("sum", "average"))
    err = validation.refusal("optimizer", "a Keras optimizer", 3, error=TypeError)
    assert isinstance(err, TypeError) and str(err) == "`optimizer` must be a Keras optimizer. Received: optimizer=3"


@pytest.mark.parametrize("rank, said", [(0, 1), (1, 0), (2, 0)])
def test_a_warning_about_shared_arguments_is_said_by_rank_0_alone(rank, said):
    import hvd_easgd
    from hvd_easgd.app import cli

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validation.say_configuration_warnings_once(rank)
        hvd_easgd.PeriodicAverage(period=1)
        hvd_easgd.EASGD(period=1)
        warnings.warn("this rank's own disk is nearly full", ResourceWarning)  # not shared: every rank says it
    shared = [w for w in caught if issubclass(w.category, hvd_easgd.ConfigurationWarning)]
    assert len(shared) == 2 * said
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == ["this rank's own disk is nearly full"]
    for w in shared:  # train.py prints each on one line, without the library's source line under it
        line = cli.format_warning(w.message, w.category, w.filename, w.lineno, "return get(name)(**kwargs)")
        assert line == f"train.py: warning: {w.message}\n"
    other = cli.format_warning("deprecated", DeprecationWarning, "user.py", 3, "old()")
    assert other.startswith("user.py:3: DeprecationWarning: deprecated") and "old()" in other


def test_importing_hvd_easgd_on_a_rank_above_0_ignores_the_shared_warnings():
    # the launcher's rank variable is all the import reads: no TensorFlow, no collective
    code = ("import warnings, hvd_easgd; "
            "print([f for f in warnings.filters if f[2] is hvd_easgd.ConfigurationWarning and f[0] == 'ignore'] != [])")
    seen = {}
    for rank in ("0", "1"):
        env = {k: v for k, v in os.environ.items() if not k.endswith("RANK") and k != "SLURM_PROCID"}
        env["OMPI_COMM_WORLD_RANK"] = rank
        seen[rank] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    timeout=60, check=True).stdout.strip()
    assert seen == {"0": "False", "1": "True"}
