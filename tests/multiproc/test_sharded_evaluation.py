"""Sharded evaluation under horovodrun -np 2 (Gloo): shards of 181 and 180
samples, in 4 and 3 batches, give exactly the one-process figures of the whole
test set, through model.evaluate and through fit's val_ logs."""
import pytest

from tests.helpers import horovodrun, read_rank_results, script

pytestmark = pytest.mark.multiproc
SIZE = 2


@pytest.mark.timeout(200)
def test_uneven_shards_give_the_whole_test_sets_loss_and_accuracy(tmp_path):
    proc = horovodrun([script("sharded_evaluation.py"), str(tmp_path)], np=SIZE, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = read_rank_results(tmp_path, SIZE)
    assert [r["shard_batches"] for r in ranks] == [4, 3]
    for r in ranks:
        whole = r["whole"]
        assert abs(r["own_shard"]["loss"] - whole["loss"]) > 1e-4  # one shard alone is not the answer
        for how in ("evaluate", "fit_validation"):
            assert r[how]["loss"] == pytest.approx(whole["loss"], abs=1e-6), how
            assert r[how]["accuracy"] == pytest.approx(whole["accuracy"], abs=1e-6), how
        assert r["account"] == {"bytes": 0, "calls": 0}  # bookkeeping collectives are not training traffic
