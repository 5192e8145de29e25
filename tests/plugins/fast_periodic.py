"""A strategy defined outside hvd_easgd, as a user's plugin would be
(docs/plugins.md): PeriodicAverage under another name. It declares nothing
else, so it takes PeriodicAverage's options (``--tau``), ``--scale-lr`` rule
and resize rule. ``train.py --plugin fast_periodic`` imports it (with this
folder on PYTHONPATH); importing it registers the strategy.

With ``FAST_PERIODIC_IMPORT_LOG`` set, every import appends its process id
to that file, so a launched test can see each rank (and a ``--resume``)
import it.
"""
import os

import keras

import hvd_easgd

if os.environ.get("FAST_PERIODIC_IMPORT_LOG"):
    with open(os.environ["FAST_PERIODIC_IMPORT_LOG"], "a") as log:
        log.write(f"{os.getpid()}\n")


@keras.saving.register_keras_serializable(package="fast_periodic")
class FastPeriodic(hvd_easgd.PeriodicAverage):
    """PeriodicAverage, registered from outside the package."""

    name = "fast_periodic"
    description = "PeriodicAverage registered by a plugin (tests/plugins/fast_periodic.py)"


hvd_easgd.registry.register(FastPeriodic)
