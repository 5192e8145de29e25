"""The rated-link benchmark end to end, at its smallest: ``python -m benchmarks.compare
--quick --link-rates 100mbit`` builds its own two-host cluster, measures the link,
times the six configurations on the digits CNN across it, and removes the cluster.

The schema is checked, the measured rate against the tc rate, the bytes each
configuration moved against their formula, and c and T against the rows they
come from."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run

pytestmark = pytest.mark.multinode

CONFIGS = {"no_comm", "raw_horovod", "sync", "easgd_tau4", "easgd_tau10", "accum4_sync"}
BATCH = 32
# The digits CNN (8×8×1, 10 classes): conv 3·3·1·16+16, conv 3·3·16·32+32, dense 512·64+64, dense 64·10+10.
GRADIENT_BYTES = 4 * ((9 * 16 + 16) + (9 * 16 * 32 + 32) + (4 * 4 * 32 * 64 + 64) + (64 * 10 + 10))
BYTES_PER_STEP = {"no_comm": 0, "raw_horovod": GRADIENT_BYTES, "sync": GRADIENT_BYTES,
                  "easgd_tau4": (GRADIENT_BYTES + 4) / 4, "easgd_tau10": (GRADIENT_BYTES + 4) / 10,
                  "accum4_sync": (GRADIENT_BYTES + 4) / 4}
NOMINAL = 100e6


@pytest.mark.timeout(150)
def test_quick_rated_link_run(tmp_path):
    name = f"hvdq{os.getpid()}"[:12]
    cmd = [sys.executable, "-m", "benchmarks.compare", "--quick", "--link-rates", "100mbit", "--cluster-name", name,
           "--repeats", "1", "--out", str(tmp_path), "--launch-timeout", "110"]
    out = run(cmd, timeout=140, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert name not in netns  # the benchmark's cluster is gone
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["topology"]["hosts"] == 2 and results["topology"]["np"] == 2
    assert results["horovod_settings"]["environment"]["OMPI_MCA_btl_tcp_if_include"] == "cluster0"
    [link] = results["links"]
    assert link["nominal_bits_per_second"] == NOMINAL
    # tbf lets through no more than its rate (plus one bucket); TCP and framing cost some of it.
    assert 0.5 * NOMINAL < link["measured_bits_per_second"] < 1.1 * NOMINAL, link
    rows = {r["config"]: r for r in results["rows"]}
    assert set(rows) == CONFIGS
    for config, row in rows.items():
        assert row["link"] == {"nominal": "100mbit", "measured_mbit": link["measured_mbit"]}
        assert row["bytes_per_sample"] == pytest.approx(BYTES_PER_STEP[config] / BATCH), config
    [analysis] = results["analysis"]
    step = {c: BATCH * 2 / rows[c]["samples_per_sec"]["median"] for c in ("no_comm", "sync")}
    assert analysis["compute_seconds_per_step"] == pytest.approx(step["no_comm"])
    assert analysis["sync_comm_seconds_per_step"] == pytest.approx(max(step["sync"] - step["no_comm"], 0))
    c, t = step["no_comm"], analysis["sync_comm_seconds_per_step"]
    assert analysis["easgd"]["10"]["analytic"] == pytest.approx((c + t) / (c + t / 10))
    # Across 100 Mbit/s the CNN's 153 KB per SyncAverage step cost more than its compute (measured ~3×).
    assert rows["easgd_tau10"]["samples_per_sec"]["median"] > rows["sync"]["samples_per_sec"]["median"]
    assert (tmp_path / "throughput_vs_link_rate.png").stat().st_size > 0
    assert "| sync |" in (tmp_path / "results.md").read_text()
