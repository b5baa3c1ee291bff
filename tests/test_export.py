"""`ablate export RUN_DIR OUT_DIR`. Special tokens are the run tokenizer's end-of-text
id, the tokenizer is written where a byte-level BPE represents it exactly, and the saved folder
is smoke-tested by generating from it; architectures no HF family represents are refused."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from conftest import TINY, copy_of_trained_run, invoke_ablate, run_ablate  # noqa: E402


def train_and_export(tmp_path_factory, tmp_path, *overrides):
    """A 2-step run (trained once per session), exported by a real `ablate export` process (its
    console is checked): (run dir, export dir, the export's result, its config.json)."""
    run_dir = copy_of_trained_run(tmp_path_factory, tmp_path, *TINY, *overrides, "train.steps=2")
    out = tmp_path / "hf"
    res = run_ablate("export", str(run_dir), str(out))
    assert res.returncode == 0, res.stderr
    return run_dir, out, res, json.loads((out / "config.json").read_text())


@pytest.mark.slow  # tokenizes the corpus with cl100k and converts its 100k ranks
def test_gpt2_block_with_cl100k_exports_cl100k_tokens_and_tokenizer(tmp_path_factory, tmp_path):
    run_dir, out, res, config = train_and_export(tmp_path_factory, tmp_path, "arch=gpt2", "tokenizer=cl100k")
    assert config["model_type"] == "gpt2"
    # cl100k's end-of-text, not GPT-2's 50256 (an ordinary cl100k token) nor Llama's 1/2
    assert config["bos_token_id"] == config["eos_token_id"] == config["pad_token_id"] == 100257
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 100257
    assert "generation check:" in res.stdout and "Loading weights" not in res.stdout + res.stderr
    from ablate.data.tokenizers import build_tokenizer

    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "Ablations, 2026: naïve café — x² = 12345 tokens.\n\n  indented\tline"
    assert tok.encode(text, add_special_tokens=False) == build_tokenizer("cl100k").encode(text)
    assert tok.eos_token_id == 100257 and tok.decode(tok.encode(text)) == text


def test_byte_tokenizer_is_written_exactly_and_special_ids_are_the_tokenizers():
    from ablate.data.tokenizers import build_tokenizer
    from ablate.hf import eot_id, hf_tokenizer

    tok, note = hf_tokenizer("byte")
    text = "héllo\x00 wörld ✓"
    assert tok.encode(text, add_special_tokens=False) == build_tokenizer("byte").encode(text)
    assert tok.eos_token_id == 256 and "byte" in note
    assert (eot_id("byte"), eot_id("gpt2"), eot_id("cl100k")) == (256, 50256, 100257)


def test_llama_run_exports_with_byte_tokens_and_a_wrong_family_is_one_line(tmp_path_factory, tmp_path):
    run_dir, out, res, config = train_and_export(tmp_path_factory, tmp_path, "arch=llama", "model.n_heads=4")
    assert config["model_type"] == "llama"
    assert config["bos_token_id"] == config["eos_token_id"] == config["pad_token_id"] == 256
    assert (out / "tokenizer.json").is_file() and "generation check:" in res.stdout
    # the tokenizer knows the model's context (not transformers' "no limit", 1e30)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64
    assert transformers.AutoTokenizer.from_pretrained(out).model_max_length == config["max_position_embeddings"]
    # the architecture is not GPT-2's: refused in one line, nothing written
    bad = invoke_ablate("export", str(run_dir), str(tmp_path / "g"), "--family", "gpt2")
    assert bad.returncode == 2 and bad.stderr.startswith("error: cannot export as HF gpt2")
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "g").exists()


def test_a_windowed_run_exports_as_mistral_and_a_family_that_would_drop_the_window_is_one_line(
        tmp_path_factory, tmp_path):
    run_dir, out, res, config = train_and_export(tmp_path_factory, tmp_path, "arch=mistral", "model.n_heads=4",
                                                 "attn.window=8")
    assert config["model_type"] == "mistral" and config["sliding_window"] == 8
    assert "generation check:" in res.stdout
    bad = invoke_ablate("export", str(run_dir), str(tmp_path / "l"), "--family", "llama")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: cannot export as HF llama: attn.window=8 (needs a class with it: HF llama has no sliding "
        "window, and would attend to every key)")
    assert not (tmp_path / "l").exists()


def test_a_dyt_run_is_refused_in_one_line_since_no_family_has_dyt(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "hf"
    r = run_ablate("run", *TINY, "arch=llama", "model.n_heads=4", "norm=dyt", "train.steps=2",
                   f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr
    res = invoke_ablate("export", str(run_dir), str(out))
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: no Hugging Face family matches this architecture: no family has norm='dyt', "
        "settings={'norm': {'alpha0': 0.5}}")
    assert not out.exists()


def test_an_unknown_family_is_refused_before_the_run_is_read(tmp_path):
    from ablate.errors import ConfigError
    from ablate.hf import export

    with pytest.raises(ConfigError, match="unknown --family 'gpt3'; choose one of gpt2, llama"):
        export(tmp_path / "no-run", tmp_path / "hf", family="gpt3")
    bad = invoke_ablate("export", str(tmp_path / "no-run"), str(tmp_path / "hf"), "--family", "gpt3")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown --family 'gpt3'")
    assert not (tmp_path / "hf").exists()
