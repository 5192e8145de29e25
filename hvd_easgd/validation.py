"""Argument checks, each refusing in Keras's one form of message:

    "`name` must be <requirement>. Received: name=<value>"

Standard library only, so any layer may import it (``hvd_easgd.startup.slurm`` stays
importable without TensorFlow). A bool is never taken for a number: ``True``
is an ``int`` to Python, but ``period=True`` is a mistake, not τ = 1. NumPy
integers and floats are accepted (they register as ``numbers.Integral`` and
``numbers.Real``), and returned as Python ``int`` and ``float``.

Example::

    self.period = validation.integer("period", period, minimum=1)
    self.rho = validation.number("rho", rho, minimum=0)
"""
import numbers
import warnings


class ConfigurationWarning(UserWarning):
    """A warning about arguments every rank shares (a strategy's hyperparameters, a Keras setting).

    Every rank would say the same words, so rank 0 alone says them: importing hvd_easgd on a rank
    that the launcher numbers 1 or above ignores this category (``say_configuration_warnings_once``).
    A user who wants them from every rank asks after the import:
    ``warnings.simplefilter("default", hvd_easgd.ConfigurationWarning)``.
    """


def say_configuration_warnings_once(rank):
    """Ignores ``ConfigurationWarning`` in this process unless it is rank 0.

    Only this category: a warning about one rank's own state (its disk, its data, a library's
    notice) still reaches the console from whichever rank has it, and errors are never filtered.
    """
    if rank != 0:
        warnings.filterwarnings("ignore", category=ConfigurationWarning)


def is_integer(value):
    """True for an integer that is not a bool (Python or NumPy)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value):
    """True for a real number that is not a bool (Python or NumPy)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def refusal(name, requirement, value, error=ValueError, gloss=""):
    """The exception for ``name=value`` that is not ``requirement``.

    Args:
      name: the argument's name, as the caller wrote it.
      requirement: what it must be, e.g. ``"an integer >= 1"``.
      value: what was received (shown with ``repr``).
      error: the exception class (``ValueError``, or ``TypeError`` for a
        value of the wrong kind).
      gloss: a note after the name, e.g. ``"(tau)"``.

    Returns:
      ``error("`name` gloss must be requirement. Received: name=value")``, to raise.
    """
    label = f"`{name}` {gloss}" if gloss else f"`{name}`"
    return error(f"{label} must be {requirement}. Received: {name}={value!r}")


def integer(name, value, minimum=None, maximum=None, allow_none=False, gloss="", condition=""):
    """``int(value)`` when ``value`` is an integer within the bounds, else refuses.

    Args:
      name: the argument's name, for the message.
      value: what was received.
      minimum: the smallest value allowed (inclusive), or None.
      maximum: the largest value allowed (inclusive), or None.
      allow_none: whether None is accepted (and returned as None).
      gloss: a note after the name in the message, e.g. ``"(tau)"``.
      condition: what else the requirement says, appended to it, e.g.
        ``", or None for one group per host"``.

    Returns:
      ``value`` as a Python int (or None).

    Raises:
      ValueError: for a bool, a non-integer or a value out of bounds.
    """
    if value is None and allow_none:
        return None
    if not is_integer(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise refusal(name, "an integer" + _bounds(name, minimum, maximum, True, True) + condition, value, gloss=gloss)
    return int(value)


def number(name, value, minimum=None, maximum=None, min_inclusive=True, max_inclusive=True, allow_none=False,
           gloss="", condition=""):
    """``float(value)`` when ``value`` is a real number within the bounds, else refuses.

    Args:
      name: the argument's name, for the message.
      value: what was received.
      minimum, maximum: the bounds, or None for no bound on that side.
      min_inclusive, max_inclusive: whether a bound itself is allowed.
      allow_none: whether None is accepted (and returned as None).
      gloss: a note after the name in the message, e.g. ``"(alpha)"``.
      condition: what else the requirement says, appended to it.

    Returns:
      ``value`` as a Python float (or None).

    Raises:
      ValueError: for a bool, a non-number, NaN or a value out of bounds.
    """
    if value is None and allow_none:
        return None
    ok = is_number(value) and value == value  # NaN is no number here: it satisfies no bound
    if ok and minimum is not None:
        ok = value >= minimum if min_inclusive else value > minimum
    if ok and maximum is not None:
        ok = value <= maximum if max_inclusive else value < maximum
    if not ok:
        bounds = _bounds(name, minimum, maximum, min_inclusive, max_inclusive)
        raise refusal(name, "a number" + bounds + condition, value, gloss=gloss)
    return float(value)


def one_of(name, value, choices):
    """``value`` when it is among ``choices``, else refuses.

    Args:
      name: the argument's name, for the message.
      value: what was received.
      choices: the values allowed (shown as given).

    Returns:
      ``value``.
    """
    if value not in choices:
        raise refusal(name, f"one of {choices}", value)
    return value


def _bounds(name, minimum, maximum, min_inclusive, max_inclusive):
    low = ">=" if min_inclusive else ">"
    high = "<=" if max_inclusive else "<"
    if minimum is not None and maximum is not None:
        low = "<=" if min_inclusive else "<"
        return f" with {minimum} {low} {name} {high} {maximum}"
    if minimum is not None:
        return f" {low} {minimum}"
    if maximum is not None:
        return f" {high} {maximum}"
    return ""
