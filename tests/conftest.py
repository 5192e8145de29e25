"""pytest hooks: the loopback-only test network, and seconds per tier. The helpers tests import live in tests/helpers.py."""
import os

import pytest

from tests import helpers
from tools import loopback_network

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config):
    # Before any test starts a server: see tools/loopback_network.py for why.
    config.hvd_easgd_network = loopback_network.enter()
    # Probed once, in the first process (xdist's workers inherit the environment).
    if not os.environ.get(helpers.SLOWDOWN_ENV):
        os.environ[helpers.SLOWDOWN_ENV] = f"{helpers.probe_slowdown():.2f}"


def pytest_report_header(config):
    return [f"test network: {config.hvd_easgd_network}",
            f"timeouts x{helpers.slowdown():.2f} (CPU probe against an ordinary day; tests/helpers.py)"]


def pytest_collection_modifyitems(config, items):
    # pytest-timeout's per-test bound (a marker, else pytest.ini's), stretched like every other timeout.
    # A marker's other settings (method=, func_only=) are kept; its bound may be positional or timeout=.
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        settings = dict(marker.kwargs) if marker else {}
        seconds = float(marker.args[0] if marker and marker.args else settings.pop("timeout", default))
        settings.pop("timeout", None)
        if seconds:
            item.add_marker(pytest.mark.timeout(helpers.bounded(seconds), **settings), append=False)


# --- seconds per tier, printed at the end of every run -------------------------------
# One `make test` then gives each tier's time (the closing notes report them),
# with module-scoped fixtures charged to the tier whose test set them up.
TIERS = ("unit", "multiproc", "slurm", "multinode")
_tier_seconds = {}


def pytest_runtest_logreport(report):
    tier = next((t for t in TIERS if t in report.keywords), "unmarked")
    seconds, tests = _tier_seconds.get(tier, (0.0, 0))
    _tier_seconds[tier] = (seconds + report.duration, tests + (report.when == "call"))


def pytest_terminal_summary(terminalreporter):
    if _tier_seconds:
        terminalreporter.write_sep("-", "seconds per tier (setup + call + teardown)")
        for tier, (seconds, tests) in sorted(_tier_seconds.items()):
            terminalreporter.write_line(f"{tier}: {tests} tests, {seconds:.0f} s")


