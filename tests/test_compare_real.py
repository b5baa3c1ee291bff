"""`ablate compare` on real tiny runs: 2 variants x 2 seeds trained by `ablate run`."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, invoke_ablate, run_ablate


@pytest.mark.slow
def test_compare_real_runs_prints_a_table_and_a_plot(tmp_path):
    for variant, extra in (("base", []), ("rms", ["norm=rmsnorm"])):
        for seed in (0, 1):
            res = run_ablate("run", *TINY, "train.threads=1", *extra, f"seed={seed}",
                             f"hydra.run.dir={tmp_path}/runs/{variant}_s{seed}")
            assert res.returncode == 0, res.stderr
    png = tmp_path / "curves.png"
    # compare reads what the runs wrote: in this process, without another start-up
    res = invoke_ablate("compare", str(tmp_path / "runs"), "--plot", str(png), env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "baseline" in out and "norm=rmsnorm" in out and "paired t, p=" in out
    assert "ok" in out and f"plot: {png}" in out
    # a real figure: two panels of curves, not an empty canvas
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < png.stat().st_size < 1_000_000
    res = invoke_ablate("compare", str(tmp_path / "runs"), "--json", "--metric", "train_loss")
    rows = {r["variant"]: r for r in json.loads(res.stdout)}
    assert rows["baseline"]["n"] == 2 and rows["norm=rmsnorm"]["n"] == 2
    summaries = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("rms_s*/summary.json"))]
    mean = sum(s["train_loss"] for s in summaries) / 2
    assert rows["norm=rmsnorm"]["mean"] == pytest.approx(mean)
    assert rows["norm=rmsnorm"]["params"] == summaries[0]["params"]
