"""The tests' deadlock bounds stretch with a slow machine (tests/helpers.py) and never shrink."""
import pytest

from tests import helpers

pytestmark = pytest.mark.unit


def test_bounded_stretches_a_timeout_by_the_sessions_slowdown(monkeypatch):
    monkeypatch.setenv(helpers.SLOWDOWN_ENV, "2.5")
    assert helpers.bounded(90) == 225
    monkeypatch.setenv(helpers.SLOWDOWN_ENV, "")
    assert helpers.bounded(90) == 90  # no probe (a helper used outside pytest): as written


def test_the_probe_never_shrinks_a_timeout_and_is_capped(monkeypatch):
    monkeypatch.setattr(helpers, "PROBE_ORDINARY_SECONDS", 1e9)  # a machine infinitely faster than ordinary
    assert helpers.probe_slowdown() == 1.0
    monkeypatch.setattr(helpers, "PROBE_ORDINARY_SECONDS", 1e-9)  # infinitely slower
    assert helpers.probe_slowdown() == helpers.MAX_SLOWDOWN


def test_this_tests_own_pytest_timeout_was_stretched(request):
    ini = float(request.config.getini("timeout"))
    assert request.node.get_closest_marker("timeout").args[0] == helpers.bounded(ini)


@pytest.mark.timeout(7)
def test_a_marked_timeout_is_stretched_too(request):
    assert request.node.get_closest_marker("timeout").args[0] == helpers.bounded(7)


@pytest.mark.timeout(timeout=5, method="thread")
def test_a_keyword_timeout_is_stretched_and_keeps_its_method(request):
    marker = request.node.get_closest_marker("timeout")
    assert marker.args[0] == helpers.bounded(5) and marker.kwargs == {"method": "thread"}
