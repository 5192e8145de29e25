"""docs/results/traffic/traffic.json is what the strategies' expected_traffic hooks say now."""
import json

import pytest

from benchmarks.costmodel import traffic_table

pytestmark = pytest.mark.unit


def test_committed_table_equals_the_hooks():
    assert json.loads(traffic_table.PATH.read_text()) == json.loads(traffic_table.render())
