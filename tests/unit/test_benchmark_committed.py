"""benchmarks.suite.committed: a program's committed files, written where they differ from their render, or
compared with --check, and what it says of them."""
import pytest

from benchmarks.suite import committed

pytestmark = pytest.mark.unit


def test_only_the_files_that_differ_are_written_and_check_writes_nothing(tmp_path, capsys):
    same, old, new = tmp_path / "same.md", tmp_path / "old.md", tmp_path / "sub" / "new.json"
    same.write_text("kept\n")
    old.write_text("before\n")
    files = {same: "kept\n", old: "after\n", new: "{}\n"}
    assert committed.update(files, check=True) == [old, new]
    assert old.read_text() == "before\n" and not new.exists()
    assert committed.status("prog", [old, new], True, "prog --report") == 1
    assert capsys.readouterr().err.splitlines() == [f"prog: {old} is stale; run `prog --report`",
                                                    f"prog: {new} is stale; run `prog --report`"]
    assert committed.update(files) == [old, new]
    assert old.read_text() == "after\n" and new.read_text() == "{}\n"
    assert committed.status("prog", [old, new], False, "prog") == 0
    assert capsys.readouterr().out.splitlines() == [str(old), str(new)]
    assert committed.update(files, check=True) == [] and committed.status("prog", [], True, "prog") == 0


def test_the_parser_has_check_and_the_programs_description():
    parser = committed.parser("prog", "What it renders.\n\nMore.")
    assert parser.parse_args(["--check"]).check and not parser.parse_args([]).check
    assert parser.description == "What it renders."
