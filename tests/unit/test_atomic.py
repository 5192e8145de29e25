"""Files written whole or not at all (hvd_easgd.atomic)."""
import json
import os

import pytest

from hvd_easgd import atomic

pytestmark = pytest.mark.unit


def test_the_file_appears_only_when_the_block_ends(tmp_path):
    path = tmp_path / "model.keras"
    path.write_text("old")
    with atomic.temporary_path(str(path)) as tmp:
        assert tmp.endswith(".keras") and os.path.dirname(tmp) == str(tmp_path)  # same filesystem: one rename
        with open(tmp, "w") as f:
            f.write("new")
        assert path.read_text() == "old"
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["model.keras"]


def test_an_error_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "metrics.json"
    atomic.write_json(str(path), {"epochs": [1]})
    with pytest.raises(KeyboardInterrupt):
        with atomic.temporary_path(str(path)) as tmp:
            with open(tmp, "w") as f:
                f.write('{"epo')
            raise KeyboardInterrupt("killed during the write")
    assert json.loads(path.read_text()) == {"epochs": [1]} and os.listdir(tmp_path) == ["metrics.json"]


def test_write_json_passes_its_options_to_json(tmp_path):
    path = tmp_path / "m.json"
    atomic.write_json(str(path), {"b": 1, "a": [2]}, indent=1, sort_keys=True)
    assert path.read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}'
