"""Every strategy at the mission's scale (issue 26 §5): `horovodrun -np 8 python train.py` at its defaults
(no --lr, no --epochs: the strategy's --scale-lr rule and the default length, 20 epochs of 5 updates at 8
ranks on digits), 8 ranks oversubscribing the 2-core machine, each reaching 0.95 test accuracy.
Horovodrun --mpi (the mission's launcher; --gloo at 8 ranks is the stack issue's elsewhere), so
--collectives auto resolves to mpi-direct. 50-90 s a run (seed 0, 2026-12-02; --accumulate 4 is 100 epochs
of 1-2 updates). Hierarchical's rule (the inter strategy's at G = 2 groups of n = 4 ranks: EASGD's
2*sqrt(4) = 4, lr 0.08) needs its options, so train.py asks the strategy it built (an instance's rule):
it ends at 0.978 (seed 0, 235 s with the shared machine at load 10-17; at lr 0.02, without the rule, 0.944)."""
import json
import math
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
    "hierarchical": ["--strategy", "hierarchical", "--ranks-per-group", "4", "--inter", "easgd"],
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
    if name == "hierarchical":  # its own rule, recorded: EASGD's at G = 2 groups of n*k = 4 batches
        assert run["learning_rate"]["factor"] == pytest.approx(2.0 * math.sqrt(4), rel=1e-12)
        assert run["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert accuracy >= 0.95
