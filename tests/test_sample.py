"""`ablate sample RUN_DIR`: text from a run's model with a KV cache, the run's own tokenizer,
greedy at --temperature 0 (the full forward pass's argmax, and Hugging Face's greedy generate of
the exported model), seeded draws from softmax(logits / T) over the top k, and bad input
refused in one line with nothing written."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from omegaconf import OmegaConf

from ablate.data.tokenizers import build_tokenizer
from ablate.errors import ConfigError
from ablate.run.record import read_record
from ablate.run.trained import load_run_model
from ablate.evaluation.sample import SampleOptions, pick, sample_run
from ablate.train import checkpoint
from ablate.names import Status
from conftest import TINY, built_once, compose, invoke_ablate, trained_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny trained run (learned positions, model.max_seq_len=64, train.seq_len=32) with
    checkpoints at steps 6 and 12, once for the session's workers (sampling only reads it)."""
    def build(d):
        trained_run(d / "run", *TINY, "train.steps=12", "train.ckpt_every=6", "train.keep_ckpts=2")

    return built_once(tmp_path_factory, "sample", build) / "run"


def sample(run_dir, *args):
    return invoke_ablate("sample", str(run_dir), *args)  # in this process: sampling runs on the CPU


def full_forward_greedy(model, prompt: list, n: int, vocab: int) -> list:
    """Greedy decoding without a cache: the whole sequence through forward at every step."""
    idx = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx).logits[:, -1, :vocab]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    return idx[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def random_run(tmp_path_factory):
    """The default architecture with random weights (write_run): greedy text that varies."""
    d = tmp_path_factory.mktemp("sample") / "random"
    write_run(d, [])
    return d


def test_greedy_is_the_full_forward_passes_argmax_and_ignores_the_seed(random_run):
    loaded, tok = load_run_model(random_run), build_tokenizer("byte")
    expected = full_forward_greedy(loaded.model, tok.encode("ROMEO:"), 30, tok.vocab_size)
    if tok.eot_id in expected:
        expected = expected[:expected.index(tok.eot_id) + 1]
    assert len(set(expected)) > 5  # text, not one token repeated
    out = sample_run(random_run, SampleOptions(prompt="ROMEO:", max_new_tokens=30, temperature=0, seed=2))
    assert out.tokens == [expected] and out.step == 1
    r = sample(random_run, "--prompt", "ROMEO:", "--max-new-tokens", "30", "--temperature", "0", "--seed", "1")
    assert r.returncode == 0, r.stderr
    text = "ROMEO:" + tok.decode(expected) + "\n"  # as a text-mode pipe reads it (universal newlines)
    assert r.stdout == text.replace("\r\n", "\n").replace("\r", "\n")


def test_the_same_seed_gives_the_same_text_and_another_seed_other_text(run_dir):
    a, b, c = (sample_run(run_dir, SampleOptions(max_new_tokens=60, num_samples=3, seed=s)) for s in (0, 0, 1))
    assert a.tokens == b.tokens != c.tokens
    assert len({tuple(t) for t in a.tokens}) == 3  # the samples of one batch differ too
    r = sample(run_dir, "--max-new-tokens", "60", "--num-samples", "3", "--seed", "0")
    assert r.returncode == 0 and r.stderr == PAST_32
    assert r.stdout == "".join(f"--- sample {i} of 3 ---\n\n{text}\n" for i, text in enumerate(a.texts, start=1))


def test_step_samples_that_checkpoint(run_dir):
    early, late = (sample_run(run_dir, SampleOptions(max_new_tokens=60, step=s)) for s in (6, None))
    assert (early.step, late.step) == (6, 12) and early.tokens != late.tokens


def test_draws_follow_softmax_over_the_top_k():
    """pick's frequencies over many draws against the probabilities they should have."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n, g = 200_000, torch.Generator().manual_seed(0)
    for temperature, top_k in [(1.0, None), (0.5, None), (2.0, 3), (1.0, 1)]:
        draws = pick(logits.expand(n, -1), temperature, top_k, g)
        freq = torch.bincount(draws, minlength=5).double() / n
        p = torch.softmax(logits.double() / temperature, -1)
        if top_k is not None:
            p[p.argsort(descending=True)[top_k:]] = 0
            p /= p.sum()
        assert (freq - p).abs().max() < 4 * (0.25 / n) ** 0.5, (temperature, top_k, freq, p)
    assert torch.equal(pick(logits[None], 0.0, None, g), torch.tensor([0]))


def test_a_prompt_past_the_training_length_is_cut_from_the_left_with_a_notice(run_dir):
    r = sample(run_dir, "--prompt", "x" * 40 + "abc", "--max-new-tokens", "5", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == ("notice: the prompt is 43 tokens, longer than the run's training "
                                        "length (train.seq_len=32): using its last 32")
    assert r.stdout.startswith("x" * 29 + "abc") and not r.stdout.startswith("x" * 30)


def test_a_learned_table_ends_generation_with_a_message(run_dir):
    """model.max_seq_len=64: a 32-token prompt leaves room for 32 new tokens."""
    r = sample(run_dir, "--prompt", "y" * 32, "--max-new-tokens", "100", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == 32 + 32 + 1  # bytes that are all ASCII here
    assert r.stderr == PAST_32 + ("notice: stopped after 32 new tokens: pos=learned places at most "
                                  "model.max_seq_len=64 tokens (prompt and text); a shorter --prompt "
                                  "leaves more room\n")
    within = sample(run_dir, "--prompt", "y" * 16, "--max-new-tokens", "16", "--temperature", "0")
    assert within.returncode == 0 and within.stderr == ""  # 32 tokens: all trained positions


PAST_32 = ("notice: past token 32 (train.seq_len, the run's training length) the model reads positions it never "
           "trained at (pos=learned: rows of its table that training never updated); the text may degrade there\n")


def _snapshot(d):
    return {p: p.stat().st_mtime_ns for p in d.rglob("*")}


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-0.5"], "--temperature must be >= 0 (0: greedy), got -0.5"),
    (["--top-k", "0"], "--top-k must be >= 1 (or left out: every token), got 0"),
    (["--step", "5"], "no checkpoint of step 5; there are: 6, 12"),
], ids=["temperature", "top-k", "step"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(run_dir, args, message):
    before = _snapshot(run_dir)
    r = sample(run_dir, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: ") and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize("options, message", [
    (dict(temperature=float("nan")), "--temperature must be >= 0 (0: greedy), got nan"),
    (dict(max_new_tokens=0), "--max-new-tokens must be >= 1, got 0"),
    (dict(num_samples=0), "--num-samples must be >= 1, got 0"),
    (dict(prompt=""), "--prompt is empty: give some text, or leave it out to start from a newline"),
    (dict(threads=-2), "--threads must be 0 (chosen from the free cores) or a number of threads, got -2"),
], ids=["nan-temperature", "max-new-tokens", "num-samples", "empty-prompt", "threads"])
def test_options_that_cannot_sample_are_refused_before_the_run_is_read(tmp_path, options, message):
    with pytest.raises(ConfigError) as e:
        sample_run(tmp_path / "no-such-run", SampleOptions(**options))
    assert str(e.value) == message


def test_a_run_without_weights_or_diverged_is_refused(run_dir, tmp_path):
    bare = shutil.copytree(run_dir, tmp_path / "bare")
    shutil.rmtree(bare / "checkpoints")
    r = sample(bare)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {bare}: no checkpoint: the run kept none")
    diverged = shutil.copytree(run_dir, tmp_path / "diverged")
    record = read_record(diverged)
    record.status, record.reason, record.step = Status.DIVERGED, "non-finite loss", 9
    record.write(diverged)
    r = sample(diverged)
    assert r.returncode == 2 and "the run diverged at step 9 (non-finite loss)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


# ---- greedy `ablate sample` equals Hugging Face's greedy generate of the exported model ----------
FAMILY_RUNS = {  # a run each family exports (ablate/hf/families.py)
    "gpt2": ["arch=gpt2"],
    "llama": ["arch=llama", "model.n_heads=4"],
    "qwen3": ["arch=llama", "model.n_heads=4", "qk_norm=on"],
    "qwen3_moe": ["arch=llama", "model.n_heads=4", "qk_norm=on", "ffn=moe", "ffn.dense_first=1"],
    "mixtral": ["arch=llama", "model.n_heads=4", "ffn=moe", "ffn.renorm=true"],
    "gemma2": ["arch=llama", "norm_pos=sandwich", "act=geglu", "tie=tied", "attn=mha", "model.emb_scale=true",
               "model.attn_softcap=5.0", "model.logit_softcap=3.0"],
    "deepseek_v3": ["arch=deepseek_dense"],  # sampled by absorption from the latent cache
    # one head of 64: QK-norm keeps q.k near its RMS, so a narrow head attends too evenly to write text
    "gemma3_text": ["arch=llama", "norm_pos=sandwich", "act=geglu", "tie=tied", "attn=mha", "model.emb_scale=true",
                    "qk_norm=on", "model.d_model=64", "model.n_heads=1"],
    # sliding windows of 8 keys: the prompt and 24 tokens wrap the ring buffer
    "mistral": ["arch=mistral", "model.n_heads=4", "attn.window=8"],
    "ministral": ["arch=mistral", "model.n_heads=4", "attn.window=8", "attn.global_every=2"],
}
# further runs a family exports: arch=deepseek (MLA with the MoE: sigmoid router, choice bias, a shared
# expert), trained with a capacity factor: sampling is dropless, as the exported model is
MORE_RUNS = {"deepseek_v3-moe": ("deepseek_v3", ["arch=deepseek", "ffn.capacity=1.0"])}
RUNS = {**{f: (f, o) for f, o in FAMILY_RUNS.items()}, **MORE_RUNS}


def write_run(run_dir, overrides) -> None:
    """A run directory (config.yaml, one checkpoint) with random weights large enough that
    greedy text follows no single token (a few training steps would print one byte again and again)."""
    cfg = compose([*TINY, *overrides])
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelSpec.from_config(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 2 * p.shape[-1] ** -0.5) if p.ndim > 1 else p.add_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():  # an MoE's choice bias, as training leaves it
            if name.endswith("choice_bias"):
                b.normal_(0, 0.2)
        model.tok_emb.weight.div_(model.emb_multiplier)  # else the token itself outweighs the blocks
    os.makedirs(run_dir)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    checkpoint.save(run_dir, 1, {"step": 1, "model": model.state_dict()})


def test_every_family_is_covered():
    from ablate.hf import FAMILIES

    assert set(FAMILY_RUNS) == set(FAMILIES.names())


@pytest.mark.parametrize("case", list(RUNS))
def test_greedy_sample_equals_the_exported_models_greedy_generate(case, tmp_path):
    transformers = pytest.importorskip("transformers")
    from ablate.hf import export

    family, overrides = RUNS[case]
    run = tmp_path / "run"
    write_run(run, overrides)
    out = export(run, tmp_path / "hf", family=family, check=False).path
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok, n = build_tokenizer("byte"), 24
    prompt = tok.encode("ROMEO:")
    with torch.no_grad():  # the model's padding ids (>= the tokenizer's 257) are never drawn, as in ours
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          suppress_tokens=list(range(tok.vocab_size, hf.config.vocab_size)))
    theirs = ids[0, len(prompt):].tolist()
    assert len(set(theirs)) > 5  # text, not one token repeated
    r = sample(run, "--prompt", "ROMEO:", "--max-new-tokens", str(n), "--temperature", "0")
    assert r.returncode == 0, r.stderr
    text = "ROMEO:" + tok.decode(theirs) + "\n"  # as a text-mode pipe reads it (universal newlines)
    assert r.stdout == text.replace("\r\n", "\n").replace("\r", "\n")
    assert sample_run(run, SampleOptions(prompt="ROMEO:", max_new_tokens=n, temperature=0)).tokens == [theirs]
