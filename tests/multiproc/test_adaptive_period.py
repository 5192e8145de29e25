"""train.py --tau adaptive under horovodrun --gloo -np 2: every epoch row of metrics.json
records the period in force and the epoch's synchronisations, and the run learns.

The run is "adaptive-period" of tests/multiproc/helpers.py's pair_launch(): one Gloo launch of 2 ranks
shared with other modules' runs (scripts/train_runs.py calls train.py's main() for each on every rank)."""
import json
import os
import re

import pytest

from tests.multiproc.helpers import PAIR_LAUNCH_SECONDS, assert_run_ended_well, pair_argv, pair_launch

pytestmark = pytest.mark.multiproc
FINAL = re.compile(r"final test accuracy: (\d\.\d{4})")


@pytest.mark.timeout(PAIR_LAUNCH_SECONDS + 60)  # may set up the shared launch: its bound, and a margin
def test_periodic_with_an_adaptive_period_records_tau_per_epoch(tmp_path_factory):
    out, launch = pair_launch(tmp_path_factory)
    argv = pair_argv(out, "adaptive-period")
    assert argv == ["--strategy", "periodic", "--tau", "adaptive", "--tau-max", "40", "--epochs", "3", "--run-dir",
                    os.path.join(out, "adaptive-period", "run")]
    proc = assert_run_ended_well(out, "adaptive-period", argv, launch, 2)
    run_dir = argv[-1]
    rows = json.load(open(os.path.join(run_dir, "metrics.json")))["epochs"]
    assert len(rows) == 3
    for row in rows:
        assert 1 <= row["tau"] <= 40 and row["synchronisations"] >= 1, row
    # τ₀ = 10 for the first interval; the loss falls with a constant lr, so τ shrinks below it.
    assert rows[0]["tau"] <= 10
    # two calls per sync (the weights, then the loss's 2 elements), none between: the same steps per epoch
    steps = {round(2 * row["synchronisations"] / row["collective_calls_per_step"], 6) for row in rows}
    assert len(steps) == 1 and float(steps.pop()).is_integer()
    # the loss falls at a constant lr, so tau never grows past tau0 here
    assert all(row["tau"] <= 10 for row in rows) and rows[-1]["tau"] < 10
    assert float(FINAL.search(proc.stdout).group(1)) >= 0.85
