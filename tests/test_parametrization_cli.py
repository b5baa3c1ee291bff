"""The `param` axis from the command line: bad input refused in one line before anything is
written, `ablate inspect` showing the rules, the run record keeping the base shape, and `ablate
export` refusing a muP model (Hugging Face has no muP multipliers)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, find_run_dirs, read_summary, run_ablate

NO_ROLE_NORM = '''\
import torch
from torch import nn

from ablate.plugins import register_option


class UntaggedNorm(nn.Module):
    def __init__(self, d, eps=1e-5, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))  # no tag(): no role

    def forward(self, x):
        return x * self.weight


register_option("norm", "untagged", UntaggedNorm, params=lambda spec, d: d)
'''


@pytest.mark.parametrize("args, message", [
    (["param=mu"], "Available options in 'param': completep, mup, sp"),
    (["param=mup", "model.base_width=0"], "model.base_width must be a positive integer or null"),
    (["param=completep", "model.base_depth=-2"], "model.base_depth must be a positive integer or null"),
    (["param=mup", "model.base_width=15"], "model.base_width=15 is not divisible by model.n_heads=2"),
    (["param=mup", "arch=vaswani"], "model.init=xavier and model.emb_scale=true scale the embeddings with the "
                                    "width, which param=mup keeps width-independent: set model.init=normal "
                                    "model.emb_scale=false or use param=sp"),
    (["param=completep", "model.emb_scale=true"], "model.emb_scale=true scales the embeddings with the width"),
    (["param=mup", "norm=untagged", "plugins=[no_role_norm]"],
     "parameter blocks.0.norm1.weight (32,) has no role, and param=mup sets init and LR by role"),
])
def test_bad_param_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "no_role_norm.py").write_text(NO_ROLE_NORM)
    out = tmp_path / "runs"
    plugin = any(a.startswith("plugins=") for a in args)  # a process of its own: it imports the plugin
    r = run_ablate("run", *TINY, *args, f"out_dir={out}", env={"PYTHONPATH": str(tmp_path / "src")} if plugin else None)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr
    assert not out.exists() and not find_run_dirs(tmp_path)


def test_inspect_shows_the_parametrization_and_each_rule():
    args = ["param=mup", "model.d_model=128", "model.base_width=32", "model.n_heads=4", "logger=none"]
    r = run_ablate("inspect", *args, "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["parametrization"]
    assert (p["param"], p["base_width"], p["base_depth"]) == ("mup", 32, 4)  # depth: the model's own
    assert (p["width_mult"], p["logit_mult"], p["branch_mult"]) == (4.0, 0.25, 1.0)
    assert p["attn_scale"] == pytest.approx(8 ** 0.5 / 32)  # sqrt(base head dim) / head dim
    hidden = {(row["role"], row["fan_in"], row["base_fan_in"]): row for row in p["rules"] if row["fan_in"]}
    assert set(hidden) == {("input", 128, 32), ("output", 128, 32), ("output", 512, 128)}
    assert {row["lr_mult"] for row in hidden.values()} == {0.25}
    assert hidden[("input", 128, 32)]["init_std"] == pytest.approx(0.02 * 0.5)
    assert hidden[("output", 512, 128)]["init_std"] == pytest.approx(0.02 * 0.5 / 8 ** 0.5)  # / sqrt(2L)
    embedding = next(row for row in p["rules"] if row["role"] == "embedding")
    assert (embedding["lr_mult"], embedding["init_std"]) == (1.0, 0.02)
    text = run_ablate("inspect", *args)
    assert text.returncode == 0, text.stderr
    assert "parametrization mup: base width 32, base depth 4; width x4, depth x1; logits x0.25" in text.stdout
    assert "init and LR by parameter role" in text.stdout and "128 (32)" in text.stdout


def test_the_record_keeps_the_base_shape_and_export_refuses_mup(tmp_path):
    from ablate.run.record import read_record

    sp_dir, mup_dir = tmp_path / "sp", tmp_path / "mup"
    for run_dir, args in ((sp_dir, []), (mup_dir, ["param=mup", "model.base_width=16"])):
        r = run_ablate("run", *TINY, "train.steps=1", *args, f"hydra.run.dir={run_dir}")
        assert r.returncode == 0, r.stderr
    sp, mup = read_summary(sp_dir), read_summary(mup_dir)
    assert (sp["param"], sp["base_width"], sp["base_depth"]) == ("sp", 32, 2)  # its own shape
    assert (mup["param"], mup["base_width"], mup["base_depth"]) == ("mup", 16, 2)
    assert mup["axes"]["param"] == "mup" and list(sp) == list(mup)
    record = read_record(mup_dir)
    assert (record.info.param, record.info.base_width, record.info.base_depth) == ("mup", 16, 2)
    bad = run_ablate("export", str(mup_dir), str(tmp_path / "hf"))
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "param='mup'" in bad.stderr and not (tmp_path / "hf").exists()


def test_a_run_recorded_before_param_existed_is_the_sp_run(tiny):
    """A config.yaml saved without `param` and `model.base_width` re-enters as the sp run it
    trained (resume, return, sweep re-runs), and a real change of param is still one."""
    from omegaconf import OmegaConf

    from ablate.run.lifecycle import differences
    from conftest import compose

    cfg = compose(tiny)
    stored = OmegaConf.to_container(cfg, resolve=False)
    del stored["param"], stored["model"]["base_width"], stored["model"]["base_depth"]
    assert differences(stored, cfg) == []
    assert differences(stored, compose([*tiny, "param=mup"])) == [("param.name", "sp", "mup")]
