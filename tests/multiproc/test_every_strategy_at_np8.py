"""Every strategy at the mission's scale (issue 26 §5): `horovodrun -np 8 python train.py` at its defaults
(no --lr, no --epochs: the strategy's --scale-lr rule and the default length, 20 epochs of 5 updates at 8
ranks on digits), 8 ranks oversubscribing the 2-core machine, each reaching 0.95 test accuracy.
Horovodrun --mpi (the mission's launcher; --gloo at 8 ranks is the stack issue's elsewhere), so
--collectives auto resolves to mpi-direct. 50-90 s a run (seed 0, 2026-12-02; --accumulate 4 is 100 epochs
of 1-2 updates). Not here: `--strategy hierarchical --ranks-per-group 4 --inter easgd`, an open defect
(issue 26): Hierarchical has no --scale-lr rule, so at its defaults it trains at 0.02 and ended at 0.944
(seed 0); sync's factor for the 4 ranks of a group (--lr 0.08) reached 0.978. A rule needs ranks_per_group
and the inter strategy, which the class-level lr_scale_factor(size, k) is not given."""
import json
import os

import pytest
import yaml

from tests.helpers import ROOT, horovodrun

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
RUNS = {
    "easgd": ["--strategy", "easgd"],
    "periodic": ["--strategy", "periodic"],
    "diloco": ["--strategy", "diloco"],
    "accumulate": ["--accumulate", "4"],
}


@pytest.mark.timeout(450)  # 50-90 s idle; 260 s measured with the shared machine at load 13
@pytest.mark.parametrize("argv", list(RUNS.values()), ids=list(RUNS))
def test_every_strategy_reaches_095_at_its_defaults_on_8_ranks(argv, tmp_path, request):
    name = request.node.callspec.id
    run_dir = str(tmp_path / "run")
    proc = horovodrun([TRAIN, "--run-dir", run_dir, *argv], np=8, controller="mpi", timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    run = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    accuracy = metrics["final"]["test_accuracy"]
    print(f"{name} at np=8: final test accuracy {accuracy:.4f}, lr {run['learning_rate']['rate']:.4g}, "
          f"{run['config']['epochs']} epochs")
    assert run["num_ranks"] == 8 and run["config"]["lr"] == 0.02  # the defaults, not a tuned run
    assert [row["epoch"] for row in metrics["epochs"]] == list(range(1, run["config"]["epochs"] + 1))
    assert accuracy >= 0.95
