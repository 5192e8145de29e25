"""benchmarks.accuracy.parity_by_np: parity folders at several np side by side, from folders of runs written here
by hand (runs.json and each run's metrics.json); the committed pages against a fresh render."""
import glob
import json
import os

import pytest

from benchmarks.accuracy import parity, parity_by_np
from benchmarks.suite.runner import REPO_ROOT

pytestmark = pytest.mark.unit
# The committed pages: each folder under docs/results/ that this command wrote.
COMMITTED = sorted(os.path.dirname(path) for path in glob.glob(
    os.path.join(REPO_ROOT, "docs", "results", "*", parity_by_np.SOURCES)))


def write_folder(directory, workload, np_, values_by_name, rss_mb=None, **index):
    """A parity folder as ``parity`` leaves it at ``np_``: each configuration's final metric per seed
    (``values_by_name``, in run order), its runs.json (with more of ``index``) and a parity.md; with
    ``rss_mb``, ``{run: each rank's MB}`` in its runs' last epoch rows."""
    os.makedirs(directory)
    metric, runs = parity.WORKLOADS[workload].metric, []
    for name, values in values_by_name.items():
        for seed, value in enumerate(values):
            os.makedirs(directory / f"{name}-seed{seed}")
            rows = [{"loss": value, "rss_mb": rss_mb[f"{name}-seed{seed}"]}] if rss_mb else []
            (directory / f"{name}-seed{seed}" / "metrics.json").write_text(json.dumps({"epochs": rows,
                                                                                      "final": {metric: value}}))
            runs.append({"run": f"{name}-seed{seed}", "variant": name, "twin": None, "seed": seed,
                         "command": f"horovodrun -np {np_} python train.py --strategy {name} --seed {seed}"})
    (directory / "runs.json").write_text(json.dumps({"workload": workload, "np": np_, "flags": "", **index,
                                                     "seeds": 3, "runs": runs, "failures": []}))
    (directory / parity.TABLE).write_text("")  # there as parity leaves it; by-np reads only the runs
    return str(directory)


def rows_of(text):
    return {line.split(" | ")[0].strip("| `"): [cell.strip(" |") for cell in line.split(" | ")[1:]]
            for line in text.splitlines() if line.startswith("| `")}


def language_model_folders(tmp_path):
    # np 2: DiLoCo first in run order (sync is still the first row), EASGD a single seed
    np2 = write_folder(tmp_path / "np2", "language_model", 2, {"diloco_tau10": (2.05, 2.4, 2.1),
                                                               "sync": (2.0, 2.2, 2.1), "easgd_tau10": (2.3,)})
    np4 = write_folder(tmp_path / "np4", "language_model", 4, {"sync": (2.4, 2.5, 2.6),
                                                               "diloco_tau10": (2.55, 2.6, 2.65)})
    return np2, np4


def test_the_table_gives_each_np_the_mean_its_range_its_seeds_and_the_mean_against_sync(tmp_path):
    np2, np4 = language_model_folders(tmp_path)
    out = tmp_path / "by-np"
    text = parity_by_np.write([np4, np2], str(out))  # given in any order, the columns by np ascending
    assert (out / parity_by_np.PAGE).read_text() == text
    assert "| configuration | np 2: mean (min–max), seeds | np 2: vs sync | np 4: mean (min–max), seeds | " \
           "np 4: vs sync |" in text
    rows = rows_of(text)
    assert list(rows) == ["sync", "diloco_tau10", "easgd_tau10"]
    assert rows["sync"] == ["2.1000 (2.0000–2.2000), 3 seeds", "—", "2.5000 (2.4000–2.6000), 3 seeds", "—"]
    # diloco: mean 2.1833 against 2.1, +3.97 %; at np 4 2.6 against 2.5, +4.00 %
    assert rows["diloco_tau10"] == ["2.1833 (2.0500–2.4000), 3 seeds", "+3.97 %", "2.6000 (2.5500–2.6500), 3 seeds",
                                    "+4.00 %"]
    # one seed is said as fewer than a goal is judged on; no runs at np 4 is a dash
    assert rows["easgd_tau10"] == ["2.3000 (2.3000–2.3000), 1 of 3 seeds", "+9.52 %", "—", "—"]
    # the answer first, from the same means
    assert text.splitlines()[0] == (
        "Runs at every np here (2 and 4): `sync`, `diloco_tau10`; at np 2 only: `easgd_tau10`. `sync`'s mean final "
        "validation loss (nats/token): 2.1000 at np 2 and 2.5000 at np 4. Against `sync` at the same np: "
        "`diloco_tau10` +3.97 % at np 2 and +4.00 % at np 4.")
    assert "![Final validation loss (nats/token) against np](by-np.png)" in text
    assert (out / parity_by_np.PLOT).stat().st_size > 10_000
    # sources.json names the folders from the page's own folder, and makes the same page again
    assert json.loads((out / parity_by_np.SOURCES).read_text()) == {"sources": ["../np4", "../np2"]}
    assert parity_by_np.sources(str(out)) == [np4, np2]
    assert parity_by_np.render(parity_by_np.sources(str(out)), str(out)) == text


def test_an_accuracy_is_set_against_syncs_in_points(tmp_path):
    np1 = write_folder(tmp_path / "np1", "fashion_mnist", 1, {"sync": (0.92, 0.921, 0.922)})
    np2 = write_folder(tmp_path / "np2", "fashion_mnist", 2, {"sync": (0.910, 0.912, 0.911),
                                                              "periodic_tau10": (0.906, 0.907, 0.909)})
    text = parity_by_np.render([np1, np2], str(tmp_path))
    # 0.9073 against 0.911: -0.37 pp
    assert rows_of(text)["periodic_tau10"] == ["—", "—", "0.9073 (0.9060–0.9090), 3 seeds", "-0.37 pp"]
    assert text.startswith("Runs at every np here (1 and 2): `sync`; at np 2 only: `periodic_tau10`. `sync`'s mean "
                           "final test accuracy: 0.9210 at np 1 and 0.9110 at np 2.\n")


@pytest.mark.parametrize("odd,why", [
    ({"workload": "fashion_mnist"}, "has workload='fashion_mnist' where {np2} has workload='language_model'"),
    ({"np": 2}, "has np=2, as {np2} does"),
    ({"flags": "--epochs 1"}, "has flags='--epochs 1' where {np2} has flags=''"),
    ({"budget": 2.5}, "has budget=2.5 where {np2} has budget=None"),
])
def test_folders_of_another_workload_budget_or_flags_or_the_same_np_are_refused_naming_the_odd_one(tmp_path, odd, why):
    np2, _ = language_model_folders(tmp_path)
    other = write_folder(tmp_path / "other", odd.pop("workload", "language_model"), odd.pop("np", 4),
                         {"sync": (0.9, 0.91, 0.92)}, **odd)
    with pytest.raises(ValueError) as refused:
        parity_by_np.write([np2, other], str(tmp_path / "out"))
    assert str(refused.value).startswith("`directories` must be parity folders (each its runs.json and parity.md) of "
                                         "one workload, budget and flags, at a different np each. Received: "
                                         f"directories=['{np2}', '{other}']")
    assert str(refused.value).endswith(f"({other} {why.format(np2=np2)})")
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_command_refuses_a_folder_of_another_kind_in_one_line_with_status_2(tmp_path, capsys):
    np2, np4 = language_model_folders(tmp_path)
    (tmp_path / "empty").mkdir()
    fashion = write_folder(tmp_path / "fashion", "fashion_mnist", 8, {"sync": (0.92,)})
    for argv, message in (
            (["--out", str(tmp_path / "out"), np2, str(tmp_path / "empty")], f"({tmp_path / 'empty'} has no runs.json "
                                                                             "or parity.md)"),
            (["--out", str(tmp_path / "out"), np2, fashion], f"({fashion} has workload='fashion_mnist' where"),
            (["--render", str(tmp_path)], f"`--render` must name a folder this command wrote (its sources.json). "
                                          f"Received: --render={tmp_path}"),
            (["--out", str(tmp_path / "out")], "`--out` must be given with one DIR or more, or `--render` alone."),
            (["--render", str(tmp_path), np2], "`--out` must be given with one DIR or more, or `--render` alone.")):
        with pytest.raises(SystemExit) as exited:
            parity_by_np.main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        assert [line for line in err.splitlines() if "error:" in line] == [line for line in err.splitlines()
                                                                           if message in line], err
    # and the entry point's command writes the page, and --render makes it again from its sources.json
    assert parity_by_np.main(["--out", str(tmp_path / "out"), np2, np4]) == 0
    written = capsys.readouterr().out
    assert parity_by_np.main(["--render", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == written == (tmp_path / "out" / parity_by_np.PAGE).read_text()


@pytest.mark.parametrize("out", COMMITTED)
def test_every_committed_page_is_its_sources_rendered(out):
    with open(os.path.join(out, parity_by_np.PAGE)) as f:
        assert f.read() == parity_by_np.render(parity_by_np.sources(out), out)


def test_the_committed_pages_are_the_folders_of_one_length_at_every_np_and_the_docs_include_them():
    by_np = {os.path.basename(out): [os.path.basename(d) for d in parity_by_np.sources(out)]
             for out in COMMITTED}
    assert by_np == {"parity-fashion-mnist-by-np": [f"parity-fashion-mnist-np{n}" for n in (1, 2, 4, 8)],
                     "parity-language-model-by-np": ["parity-language-model-np2", "parity-language-model-np4"],
                     "parity-language-model-by-np-budget": [f"parity-language-model-np{n}-adam-rules" for n in (2, 8)]}
    for page, out in (("fashion-mnist.md", "parity-fashion-mnist-by-np"),
                      ("language-model.md", "parity-language-model-by-np"),
                      ("language-model.md", "parity-language-model-by-np-budget")):
        with open(os.path.join(REPO_ROOT, "docs", page)) as f:
            assert f'--8<-- "docs/results/{out}/{parity_by_np.PAGE}"' in f.read()


def test_the_answer_says_what_a_rank_held_at_the_largest_np_from_every_runs_rss(tmp_path):
    np2 = write_folder(tmp_path / "np2", "language_model", 2, {"sync": (2.0, 2.2, 2.1)})
    rss = {"sync-seed0": [700, 720, 710, 705], "sync-seed1": [690, 900, 700, 700],
           "sync-seed2": [800, 800, 800, 800], "diloco_tau10-seed0": [600] * 4}
    np4 = write_folder(tmp_path / "np4", "language_model", 4, {"sync": (2.4, 2.5, 2.6), "diloco_tau10": (2.6,)},
                       rss_mb=rss)
    # the largest rank 900 MB (sync seed 1); the largest run 3,200 MB = 3.1 GiB (sync seed 2), over 4 runs
    assert parity_by_np.render([np2, np4], str(tmp_path / "out")).splitlines()[0].endswith(
        "Memory at np 4: each rank's resident memory after its last epoch was at most 900 MB over the 4 runs, "
        "and the 4 ranks of a run held at most 3.1 GiB together, of this machine's 24 GiB.")
    # runs that recorded none say nothing of memory
    assert "Memory" not in parity_by_np.render(language_model_folders(tmp_path / "none"), str(tmp_path / "out"))
