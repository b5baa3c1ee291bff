"""`ablate compare` with MoE runs: the active parameters beside the total, the size note judged
by them, and the mark of a router that collapsed. The criterion is held by two real runs (a
router started 300x its init without balancing collapses onto one expert; one with a strong
balancing loss does not) and at its threshold by written runs."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.analysis.compare import compare_dirs, routing_collapsed
from ablate.analysis.load import find_runs
from ablate.model.moe import MoE
from compare_fixtures import set_config, write_run
from conftest import TINY, run_ablate

MOE = ["ffn=moe", "ffn.experts=4", "ffn.top_k=1", "train.steps=20", "train.threads=1"]


def test_compare_marks_a_router_that_collapsed_and_not_a_balanced_one(tmp_path, monkeypatch):
    def large_router(self, init):
        with torch.no_grad():
            self.router.weight.mul_(300.0)

    monkeypatch.setattr(MoE, "init_parameters", large_router, raising=False)
    res = run_ablate("run", *TINY, *MOE, "ffn.balance=none", f"hydra.run.dir={tmp_path / 'collapsed'}")
    assert res.returncode == 0, res.stderr
    monkeypatch.delattr(MoE, "init_parameters")
    res = run_ablate("run", *TINY, *MOE, "ffn.aux_coef=2.0", f"hydra.run.dir={tmp_path / 'balanced'}")
    assert res.returncode == 0, res.stderr
    res = run_ablate("compare", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["variant"]: r for r in json.loads(res.stdout)}
    assert rows["ffn.balance=none,ffn=moe"]["routing_collapsed"] == 1
    assert rows["ffn.aux_coef=2.0,ffn=moe"]["routing_collapsed"] == 0
    for r in rows.values():
        assert r["active_params"] < r["params"]  # one expert of four a token
    text = run_ablate("compare", str(tmp_path)).stdout
    assert "(routing collapsed)" in text and "routing collapsed: ffn.balance=none,ffn=moe (1 of 1 seeds)" in text


def _moe_run(root, name, imbalance: list, experts=8, top_k=2, **kw):
    rows = [{"step": s, "tokens": 128 * s, "train_loss": 3.0, "stat/moe_imbalance": v}
            for s, v in enumerate(imbalance, start=1)]
    d = write_run(root, name, {"ffn": "moe"}, 0, 3.0, rows=rows, **kw)
    set_config(d, "ffn.experts", experts)
    set_config(d, "ffn.top_k", top_k)
    return d


@pytest.mark.parametrize("tail,collapsed", [(2.5, True), (2.49, False)])
def test_collapse_is_half_way_to_every_token_on_k_experts_over_the_last_tenth(tmp_path, tail, collapsed):
    """E=8, k=2: balanced is 1, all tokens on two experts 4; the criterion is (1 + 4)/2 = 2.5,
    averaged over the last 10% of the logged steps (here the last 2 of 20)."""
    d = _moe_run(tmp_path, "run", [4.0] * 18 + [tail, tail])
    (run,) = find_runs([d])
    assert routing_collapsed(run) is collapsed
    assert routing_collapsed(find_runs([write_run(tmp_path, "dense", {}, 0, 3.0)])[0]) is None


def test_active_params_column_and_a_size_note_judged_by_them(tmp_path):
    """A dense baseline, an MoE at its active size (inside the size note's threshold) and one at
    twice it: only the latter is noted, with its active and total figures."""
    for name, params, active, experts in (("dense", 1000, 1000, None), ("moe_fair", 3000, 1004, 8),
                                          ("moe_wide", 3000, 2000, 4)):
        if experts is None:
            d = write_run(tmp_path, name, {}, 0, 3.0, params=params, sweep="s", variant=name)
        else:
            d = _moe_run(tmp_path, name, [1.2] * 10, experts=experts, params=params, sweep="s", variant=name)
        summary = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**summary, "active_params": active}))
    cmp = compare_dirs([tmp_path], allow_mixed=True)
    rows = {r.variant: r for r in cmp}
    fair, wide = rows["moe_fair"], rows["moe_wide"]
    assert fair.active_delta == 4 and not fair.size_differs and fair.params_delta == 2000
    assert wide.active_delta == 1000 and wide.size_differs
    note = next(n for n in cmp.notes if n.startswith("differs in size"))
    assert "+1,000 active params, +100.00%, judged by them; in all +2,000 params, +200.00%" in note
    assert "moe_wide" in note and "moe_fair" not in note
    res = run_ablate("compare", str(tmp_path), "--allow-mixed", "--format", "markdown")
    assert "| active params |" in res.stdout and len(rows) == 3
