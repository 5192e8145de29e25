"""Every train.py command line a user would paste from the README or the docs parses with train.py's
own parser, so an unknown or misspelt flag in the docs fails here.

The launcher prefix (``horovodrun -np N [--gloo|--mpi] ...``, ``mpirun ...``, ``srun ...``,
``sudo ... vcluster.py run --``) is stripped at ``python train.py``; an sbatch template's arguments
(``sbatch [options] slurm/train.sbatch ARGS``) go to train.py too. Blocks that need SLURM, the
virtual cluster or 8 ranks are only parsed here; the multiproc tier runs the README's own examples
(tests/multiproc/test_readme_examples.py).
"""
import os
import re
import shlex
import sys

import pytest

from hvd_easgd.app import cli
from hvd_easgd.strategies import registry
from hvd_easgd.app.errors import UsageError
from tests.helpers import ROOT

pytestmark = pytest.mark.unit

# `python train.py`, also as .venv/bin/python or python3; and the sbatch templates that run train.py.
TRAIN_PY = re.compile(r"(?:^|\s)(?:\S*/)?python3?\s+(?:\S*/)?train\.py(?=\s|$)")
SBATCH_TEMPLATE = re.compile(r"(?:^|\s)sbatch\s.*?slurm/train(?:-gpu)?\.sbatch(?=\s|$)")
FENCE = re.compile(r"^(\s*)(```|~~~)")


def doc_files():
    docs = os.path.join(ROOT, "docs")
    return [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))


def fenced_blocks(text):
    """The fenced code blocks of a Markdown text, with indented (4-space) command blocks too."""
    blocks, current, fence = [], None, None
    for line in text.splitlines():
        match = FENCE.match(line)
        if current is None and match:
            current, fence = [], match.group(2)
        elif current is not None and line.strip().startswith(fence):
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    indented = re.findall(r"(?:^|\n\n)((?: {4}\S.*\n?)+)", text)
    return blocks + [[line[4:] for line in block.splitlines()] for block in indented]


def command_lines(block):
    """The block's lines, shell continuations (``\\``) joined."""
    joined, pending = [], ""
    for line in block:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return joined


def train_py_arguments(line):
    """train.py's arguments in a shell line, or None if the line runs no train.py."""
    try:
        words = shlex.split(line, comments=True)  # a comment's "python train.py" runs nothing
    except ValueError:  # not shell (a Python line with an apostrophe)
        return None
    command = shlex.join(words)
    for pattern in (TRAIN_PY, SBATCH_TEMPLATE):
        match = pattern.search(command)
        if match:
            return shlex.split(command[match.end():])
    return None


def doc_commands():
    found = []
    for path in doc_files():
        with open(path) as f:
            text = f.read()
        for block in fenced_blocks(text):
            for line in command_lines(block):
                args = train_py_arguments(line)
                if args is not None:
                    found.append((os.path.relpath(path, ROOT), line, args))
    return found


def plugin_recipe():
    """``(module name, source)`` of docs/plugins.md's recipe: its first Python block, which opens
    with ``# <module>.py``."""
    with open(os.path.join(ROOT, "docs", "plugins.md")) as f:
        text = f.read()
    source = re.search(r"```python\n(# (\w+)\.py.*?)```", text, re.S)
    return source.group(2), source.group(1)


@pytest.fixture
def parse(monkeypatch, tmp_path):
    """cli.parse_args, with the files a --resume or --config names standing in as empty: the flags are
    what is checked, not a run directory the reader does not have. The plugin recipe of
    docs/plugins.md is importable, as the page tells the reader to make it, so its commands parse
    with the strategy it registers (the registry restored afterwards)."""
    monkeypatch.setattr(cli, "_saved_config", lambda run_dir: {})
    monkeypatch.setattr(cli, "_load_yaml", lambda path, parser: {})
    module, source = plugin_recipe()
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    # Another test's plugin may have registered the recipe's strategy name already.
    for name, entry in list(registry._REGISTRY.items()):
        if entry["cls"].__module__ not in ("builtins",) and not entry["cls"].__module__.startswith("hvd_easgd"):
            del registry._REGISTRY[name]

    def parse_args(args):
        try:
            return cli.parse_args(args)
        except SystemExit as exit_:  # --help prints and exits 0
            assert exit_.code == 0, args
            return None
    return parse_args


COMMANDS = doc_commands()


def test_the_docs_hold_the_train_py_commands_a_user_would_paste():
    where = {path for path, _, _ in COMMANDS}
    assert {"README.md", "docs/train.md", "docs/slurm.md", "docs/virtual-cluster.md"} <= where, where
    assert len(COMMANDS) >= 25, len(COMMANDS)  # 30 when written
    # The launcher prefixes the stripping handles, each met at least once.
    lines = " ".join(line for _, line, _ in COMMANDS)
    for launcher in ("horovodrun -np", "mpirun -np", "sbatch", "vcluster.py run --"):
        assert launcher in lines, launcher


@pytest.mark.parametrize("path,line,args", COMMANDS, ids=[f"{p}:{' '.join(a)[:60]}" for p, _, a in COMMANDS])
def test_a_documented_train_py_command_parses(path, line, args, parse, capsys):
    try:
        parse(args)
    except UsageError as err:
        pytest.fail(f"{path}: `{line}`: {err}")


def test_an_unknown_flag_in_a_documented_command_fails(parse):
    block = ["horovodrun -np 2 --gloo python train.py --strategy easgd \\", "    --no-such-flag 3   # a typo"]
    (line,) = command_lines(block)
    args = train_py_arguments(line)
    assert args == ["--strategy", "easgd", "--no-such-flag", "3"]
    with pytest.raises(UsageError, match="--no-such-flag"):
        parse(args)
