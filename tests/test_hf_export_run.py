"""A trained run exported as a Hugging Face folder loads with AutoModelForCausalLM and gives
the run's logits."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate.hf import export, load_run_model  # noqa: E402
from conftest import TINY, copy_of_trained_run, invoke_ablate, run_ablate  # noqa: E402


def test_trained_run_exports_to_hf_folder(tmp_path_factory, tmp_path):
    # test_export.py's llama run: trained once per session, any trained weights will do
    run_dir = copy_of_trained_run(tmp_path_factory, tmp_path, *TINY, "arch=llama", "model.n_heads=4",
                                  "train.steps=2")
    out = export(run_dir, tmp_path / "hf", check=False).path
    ours = load_run_model(run_dir).model
    ref = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(ref).__name__ == "LlamaForCausalLM" and ref.config.num_key_value_heads == 2
    idx = torch.randint(0, 257, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, ref(idx).logits, rtol=1e-5, atol=1e-5)
    # the command refuses a family the architecture does not match, in one line
    bad = invoke_ablate("export", str(run_dir), str(tmp_path / "g"), "--family", "gpt2")
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error: cannot export as HF gpt2")
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "g").exists()


def test_a_run_with_act_clamp_is_refused_not_exported_wrong(tmp_path):
    """No HF family clamps the FFN's activations: exporting would change the logits silently."""
    run_dir = tmp_path / "run"
    r = run_ablate("run", *TINY, "arch=llama", "model.n_heads=4", "model.act_clamp=0.01",
                   "train.steps=1", f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr
    bad = invoke_ablate("export", str(run_dir), str(tmp_path / "hf"))
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    # the key that blocks the export, not every family's requirements
    assert bad.stderr.startswith("error: no Hugging Face family matches this architecture: "
                                 "no family has act_clamp=0.01"), bad.stderr
    assert "gemma2" not in bad.stderr and "supported" not in bad.stderr
    assert not (tmp_path / "hf").exists()
