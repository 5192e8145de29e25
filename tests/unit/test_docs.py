"""The docs site builds in strict mode, and its measurements are the generated pages themselves.

The site is built once for the module (``python -m mkdocs build --strict``, a few seconds: MkDocs is
not a launch), into a temporary directory, never into the repository's ``site/``.
"""
import html
import os
import re
import shutil

import pytest
import yaml

from benchmarks.costmodel import cluster_check, projection_report

from benchmarks.accuracy import defaults_report, tta_report
from tests.helpers import ROOT, mkdocs_build
from tools import tf_matrix

pytestmark = pytest.mark.unit

DOCS = os.path.join(ROOT, "docs")
CONFIG = os.path.join(ROOT, "mkdocs.yml")
# The generated pages the site shows, each with the render that writes it from committed results.
RENDERED_PAGES = {
    "default-collectives.md": defaults_report.render,
    "defaults-at-n-ranks.md": defaults_report.render_training,
    "benchmark-suite.md": defaults_report.render_suite,
    "wire-results.md": defaults_report.render_wire,
    "compression-accuracy.md": defaults_report.render_compression,
    "supported-versions.md": tf_matrix.render,
    "time-to-accuracy.md": tta_report.render,
    "overlap-results.md": tta_report.render_overlap,
    "projection.md": projection_report.render,
    "projection-tables.md": projection_report.render_tables,
    "cost-model-validation.md": cluster_check.render,
}
# Generated outside docs/ and included verbatim into a page (pymdownx.snippets), with no render
# to call here: benchmarks.suite.rated_links wrote it from a results.json that is not committed.
INCLUDED = {"benchmarks.md": "benchmarks/figures/topology_results.md"}


def _load_config(path):
    # mkdocs.yml may hold !!python tags (none today); the plain loader is enough for what is read here.
    with open(path) as f:
        return yaml.safe_load(f)


def _nav_files(nav):
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            if isinstance(value, list):
                yield from _nav_files(value)
            else:
                yield value


def _table_rows(text):
    return [line for line in text.splitlines() if line.startswith("|") and not re.match(r"^\|[-:| ]+\|$", line)]


def _cells(row):
    for cell in row.strip().strip("|").split("|"):
        for part in cell.split("<br>"):
            part = part.strip().replace("`", "").replace("**", "")
            if part:
                yield part


def _visible_text(page_html):
    text = re.sub(r"<[^>]+>", "", page_html)
    return html.unescape(text)


def _hand_written():
    """README.md and every docs page that no render writes."""
    generated = set(RENDERED_PAGES)
    paths = [os.path.join(ROOT, "README.md")]
    paths += [os.path.join(DOCS, n) for n in sorted(os.listdir(DOCS)) if n.endswith(".md") and n not in generated]
    paths += [os.path.join(DOCS, "api", n) for n in sorted(os.listdir(os.path.join(DOCS, "api")))]
    return paths


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    result = mkdocs_build(CONFIG, site_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return site_dir, result


def test_the_site_builds_in_strict_mode_with_no_warning(site):
    site_dir, result = site
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    for page in ("index.html", "strategies/index.html", "api/strategies/index.html"):
        assert (site_dir / page).is_file(), page
    # The API reference is generated from the docstrings, not written: EASGD's own parameters are there.
    api = (site_dir / "api" / "strategies" / "index.html").read_text()
    assert "hvd_easgd.strategies.easgd.EASGD" in api and "communication_period" in api
    # The committed figures join the site from benchmarks/figures/ (docs/hooks/figures.py).
    assert (site_dir / "figures" / "topology_time_to_accuracy.png").is_file()


# Both in one build (a build is the cost): strict mode counts one warning for each.
BROKEN = {"no-such-page.md": "See [the missing page](no-such-page.md).",
          "hvd_easgd.strategies.easgd.NoSuchStrategy":
              "See [a missing API object][hvd_easgd.strategies.easgd.NoSuchStrategy]."}


def test_strict_mode_fails_on_a_page_with_a_broken_link_or_reference(tmp_path):
    # A one-page site under the site's own configuration (strict, its link validation, hooks, extensions
    # and plugins, mkdocstrings resolving the references): what turns a broken link or reference into a
    # failure is that configuration, not the other pages, and the full site is built once already
    # (the `site` fixture, which proves it has no warning of its own).
    docs_copy = tmp_path / "docs"
    docs_copy.mkdir()
    (docs_copy / "index.md").write_text("# A page\n" + "".join(f"\n{bad_text}\n" for bad_text in BROKEN.values()))
    config = _load_config(CONFIG)
    # The copy's paths, absolute: everything but the docs folder is the repository's own.
    config["docs_dir"] = str(docs_copy)
    config["nav"] = ["index.md"]
    config["hooks"] = [os.path.join(ROOT, h) for h in config["hooks"]]
    for ext in config["markdown_extensions"]:
        if isinstance(ext, dict) and "pymdownx.snippets" in ext:
            ext["pymdownx.snippets"]["base_path"] = [ROOT]
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [ROOT]
    config_copy = tmp_path / "mkdocs.yml"
    config_copy.write_text(yaml.safe_dump(config, allow_unicode=True))

    result = mkdocs_build(str(config_copy), tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    for named in BROKEN:  # each broken one is its own warning
        assert [line for line in warnings if named in line], output[-3000:]
    assert "Aborted with 2 warnings in strict mode" in output, output[-3000:]


@pytest.mark.parametrize("page", sorted(RENDERED_PAGES))
def test_a_generated_page_is_in_the_nav_and_equals_its_render_from_the_committed_results(page, site):
    # The site shows the file itself (a nav entry), so what it shows is the render, not a copy of it.
    assert page in set(_nav_files(_load_config(CONFIG)["nav"]))
    rendered = RENDERED_PAGES[page]()
    with open(os.path.join(DOCS, page)) as f:
        assert f.read() == rendered
    site_dir, _ = site
    shown = _visible_text((site_dir / page[:-3] / "index.html").read_text())
    rows = _table_rows(rendered)
    assert rows
    for row in rows:
        for cell in _cells(row):
            assert cell in shown, (page, cell)


@pytest.mark.parametrize("page", sorted(INCLUDED))
def test_an_included_report_is_included_verbatim_not_copied(page, site):
    source = INCLUDED[page]
    with open(os.path.join(DOCS, page)) as f:
        assert f'--8<-- "{source}"' in f.read()
    with open(os.path.join(ROOT, source)) as f:
        report = f.read()
    site_dir, _ = site
    shown = _visible_text((site_dir / page[:-3] / "index.html").read_text())
    rows = _table_rows(report)
    assert len(rows) > 20
    for row in rows:
        for cell in _cells(row):
            assert cell in shown, (page, cell)


def test_no_hand_written_page_copies_a_row_of_a_generated_table():
    generated = []
    for page in RENDERED_PAGES:
        with open(os.path.join(DOCS, page)) as f:
            generated += [(page, row) for row in _table_rows(f.read()) if not row.startswith("| ---")]
    for source in INCLUDED.values():
        with open(os.path.join(ROOT, source)) as f:
            generated += [(source, row) for row in _table_rows(f.read())]
    # Header rows (| configuration | 1gbit | 100mbit |) may recur in prose tables; a data row may not.
    data_rows = [(origin, row) for origin, row in generated if re.search(r"\d", row)]
    assert data_rows
    for path in _hand_written():
        with open(path) as f:
            text = f.read()
        copied = [(origin, row) for origin, row in data_rows if row in text]
        assert not copied, (os.path.relpath(path, ROOT), copied[:3])


def test_the_tree_map_names_every_module():
    with open(os.path.join(DOCS, "development.md")) as f:
        page = f.read()
    tree = page[page.index("## Where things live"):page.index("## Tests")]
    missing = []
    for top in ("hvd_easgd", "tools", "benchmarks"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py") and not (name == "__init__.py" and folder != os.path.join(ROOT, top)):
                    if name not in tree:
                        missing.append(os.path.relpath(os.path.join(folder, name), ROOT))
    for helper in ("tests/helpers.py", "tests/reference.py", "tests/conftest.py", "train.py"):
        if helper not in tree:
            missing.append(helper)
    assert not missing, missing


def test_the_readme_is_at_most_12_kb_and_names_every_strategy():
    with open(os.path.join(ROOT, "README.md"), "rb") as f:
        readme = f.read()
    assert len(readme) <= 12 * 1024, len(readme)
    for name in ("SyncAverage", "EASGD", "GradientAccumulation", "PeriodicAverage", "DiLoCo", "Hierarchical"):
        assert f"| `{name}" in readme.decode(), name


HAND_WRITTEN_MAX_BYTES = 30 * 1024  # longer pages split by what a reader comes for; generated tables may run on


def test_no_hand_written_page_is_over_30_kb():
    sizes = {os.path.relpath(path, ROOT): os.path.getsize(path) for path in _hand_written()}
    assert "docs/strategies.md" in sizes and "docs/strategy-options.md" in sizes
    too_long = {path: size for path, size in sizes.items() if size > HAND_WRITTEN_MAX_BYTES}
    assert not too_long, too_long


LEAD_LINES = 5
# A rendered line of the theme's text column holds about this many characters; a lead of five long source
# lines (a generated page writes its answer as one line) must still fit in five of them.
LEAD_LINE_CHARS = 120


def lead_problem(text):
    """Why a page does not lead with its answer, or None. A page leads when, after its title, at most
    LEAD_LINES lines of prose say what it shows or what to do, and then comes one figure (an image) or
    one example (a code block), before any table, section heading or provenance comment."""
    lines = text.splitlines()
    titles = [i for i, line in enumerate(lines) if line.startswith("# ")]
    if not titles:
        return "no title"
    prose = chars = 0
    for line in lines[titles[0] + 1:]:
        stripped = line.strip()
        if stripped.startswith(("```", "    ", "![")) or line.startswith("    "):
            return None if prose else "no sentence before the figure or example"
        if not stripped:
            continue
        if stripped.startswith(("#", "|", "<!--", ":::", "--8<--")):
            return f"{stripped[:40]!r} before a figure or example"
        prose += 1
        chars += len(stripped) + 1
        if prose > LEAD_LINES or chars > LEAD_LINES * LEAD_LINE_CHARS:
            return f"more than {LEAD_LINES} lines before a figure or example"
    return "no figure or example"


def _lead_pages():
    """Every page of the site, and every titled report under docs/results/ (each run's own results.md: read
    from the repository, not the site). parity.md is a fragment a page includes, with no title of its own."""
    pages = list(_nav_files(_load_config(CONFIG)["nav"]))
    for folder, _, names in sorted(os.walk(os.path.join(DOCS, "results"))):
        for name in sorted(names):
            if name.endswith(".md"):
                with open(os.path.join(folder, name)) as f:
                    if f.read().startswith("# "):
                        pages.append(os.path.relpath(os.path.join(folder, name), DOCS))
    return pages


def test_lead_problem_finds_what_it_looks_for():
    assert lead_problem("# T\n\nDo this.\n\n```bash\nmake\n```\n") is None
    assert lead_problem("# T\n\nIt shows.\n\n![plot](figures/a.png)\n\n| a |\n") is None
    assert "before a figure" in lead_problem("# T\n\nIt shows.\n\n| a | b |\n\n![plot](a.png)\n")
    assert "before a figure" in lead_problem("# T\n\n<!-- Generated -->\n\nIt.\n\n![plot](a.png)\n")
    assert "more than" in lead_problem("# T\n\n" + "a line\n" * 6 + "\n```\nx\n```\n")
    assert "more than" in lead_problem("# T\n\n" + "word " * 130 + "\n\n```\nx\n```\n")
    assert lead_problem("# T\n\nOnly prose.\n") == "no figure or example"
    assert lead_problem("# T\n\n```\nx\n```\n") == "no sentence before the figure or example"


@pytest.mark.parametrize("page", _lead_pages())
def test_a_page_leads_with_what_it_shows_and_one_figure_or_example(page):
    with open(os.path.join(DOCS, page)) as f:
        assert lead_problem(f.read()) is None
