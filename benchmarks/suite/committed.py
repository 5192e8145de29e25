"""The files a benchmark program renders and commits (pages, tables, JSON): written where they differ from
their render, or compared with ``--check``, one way for every such program.

    parser = committed.parser(prog, __doc__)       # --check; the program adds its own options
    args = parser.parse_args(argv)
    stale = committed.update({path: text, ...}, args.check)
    return committed.status(prog, stale, args.check, rerun=prog)

``update`` writes each file whose committed text differs from its render (with ``check``, nothing) and
returns those paths; ``status`` names them, on stdout as written or on stderr as stale with the command
that rewrites them, and returns the exit status: 1 where ``--check`` found a stale file.
"""
import argparse
import sys


def parser(prog, doc, check_help="exit 1 if a committed file is stale"):
    """A program's argument parser (described by its docstring's first line), with ``--check``."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--check", action="store_true", help=check_help)
    return p


def update(files, check=False):
    """The paths of ``files`` (``{pathlib.Path: text}``) whose committed text differs from ``text`` (or that do
    not exist), each written unless ``check``."""
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    if not check:
        for path in stale:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path])
    return stale


def status(prog, paths, check, rerun):
    """Names ``paths``: as written (stdout), or with ``check`` as stale, with ``rerun``, the command that rewrites
    them (stderr); returns the exit status."""
    for path in paths:
        print(f"{prog}: {path} is stale; run `{rerun}`" if check else path, file=sys.stderr if check else sys.stdout)
    return 1 if check and paths else 0
