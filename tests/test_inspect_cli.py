"""`ablate inspect`: exact counts for real dimensions, FLOPs and KV-cache formulas, bad input."""

from __future__ import annotations

import json

import pytest

from conftest import compose, invoke_ablate, run_ablate, run_on_terminal

GPT2_SMALL = ["model=small", "tokenizer=gpt2", "model.vocab_size=50257"]


def test_gpt2_small_exact_counts_through_the_cli(tmp_path):
    # an empty tiktoken cache: inspect must not need the gpt2 encoding files
    r = run_ablate("inspect", *GPT2_SMALL, "--json", "--seq-len", "1024", "--batch", "8", "--build", "--dtype", "bf16",
                   env={"TIKTOKEN_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    d, L, V, T, ff = 768, 12, 50257, 1024, 3072
    attn = L * (d * 3 * d + 3 * d + d * d + d)  # c_attn + c_proj with biases
    ffn = L * (d * ff + ff + ff * d + d)
    assert out["params"] == {"total": 124_439_808, "embedding": V * d + T * d, "attention": attn,
                             "ffn": ffn, "norm": L * 2 * 2 * d + 2 * d, "head": 0}
    assert out["built_params"]["total"] == 124_439_808
    assert out["non_embedding_params"] == 124_439_808 - (V * d + T * d)
    assert out["flops_per_token"] == 6 * (attn + ffn + V * d) + 12 * L * d * T
    assert out["kv_cache_bytes_per_token"] == 2 * L * d * 2  # K and V, bf16
    assert out["kv_cache_bytes"] == out["kv_cache_bytes_per_token"] * 1024 * 8
    assert out["vocab"] == {**out["vocab"], "tokenizer": 50257, "model": 50257, "padded": False}


def test_human_output_states_formulas_padding_and_ffn_sizes():
    r = invoke_ablate("inspect", "act=swiglu", "--dtype", "fp32")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "6*N + 12*L*d_attn*T" in text
    assert "257 ids, padded to 320" in text
    assert "act=swiglu is gated" in text and "d_ff 336" in text and "512" in text
    # 2 * 4 layers * 4 heads * 32 * 4 bytes, at the context the report names (train.seq_len)
    assert "KV cache (fp32) at context 128 (--seq-len): 4,096 bytes/token" in text
    assert "total" in text and "non-embedding" in text


def _report_lines(stdout: str) -> list[str]:
    """The report's sentences (the table's title and rows left out)."""
    return [line for line in stdout.splitlines() if line.strip() and line[0] not in "┏┃┡│└ " and line != "parameters"]


def test_piped_the_report_is_full_lines_and_on_a_terminal_it_breaks_between_words():
    report = json.loads(run_ablate("inspect", "act=swiglu", "--json").stdout)
    piped = run_ablate("inspect", "act=swiglu", env={"COLUMNS": "80"})
    assert piped.returncode == 0, piped.stderr
    lines = _report_lines(piped.stdout)
    for sentence in (f"FFN: {report['ffn']['why']}", f"vocab: {report['vocab']['note']}"):
        assert sentence in lines and len(sentence) > 80  # one line each, though COLUMNS=80
    assert all(line == line.rstrip() for line in piped.stdout.splitlines())  # no trailing spaces
    code, seen = run_on_terminal("inspect", "act=swiglu", columns=80)
    assert code == 0, seen
    rows = [row for row in seen.splitlines() if row.strip() not in ("", "parameters") and row[0] not in "┏┃┡│└"]
    assert all(len(row) <= 80 for row in rows), rows
    rejoined: list[str] = []  # continuation lines are indented by two spaces under their line
    for row in rows:
        if row.startswith("  "):
            rejoined[-1] += " " + row.strip()
        else:
            rejoined.append(row)
    assert len(rows) > len(rejoined) and rejoined == lines  # broken only between words


def test_gqa_kv_cache_and_dtype():
    from ablate.measure.inspect import inspect_config

    cfg = compose(["arch=llama", "model.d_model=256", "model.n_heads=8", "model.n_layers=3"])
    r = inspect_config(cfg, seq_len=100, batch=2, dtype="fp16")
    assert r["spec"]["n_kv_heads"] == 2  # gqa: n_heads / 4
    assert r["kv_cache_bytes_per_token"] == 2 * 3 * 2 * 32 * 2
    assert r["kv_cache_bytes"] == r["kv_cache_bytes_per_token"] * 200
    assert r["params"]["head"] == 320 * 256  # untied
    assert r["non_embedding_params"] == r["params"]["attention"] + r["params"]["ffn"] + r["params"]["norm"]
    fp32 = inspect_config(cfg, seq_len=100, batch=2, dtype="fp32")
    assert fp32["kv_cache_bytes_per_token"] == 2 * r["kv_cache_bytes_per_token"]


def test_gqa_on_the_default_model_sits_between_mqa_and_mha():
    """The default tiny model has 4 heads: attn=gqa (and arch=llama) must not be MQA in disguise."""
    r = invoke_ablate("inspect", "attn=gqa", "--json")
    assert r.returncode == 0, r.stderr
    gqa = json.loads(r.stdout)
    from ablate.measure.inspect import inspect_config

    mqa, mha = (inspect_config(compose([f"attn={a}"])) for a in ("mqa", "mha"))
    assert gqa["spec"]["n_kv_heads"] == 2
    assert mqa["params"]["total"] < gqa["params"]["total"] < mha["params"]["total"]
    assert mqa["kv_cache_bytes_per_token"] < gqa["kv_cache_bytes_per_token"] < mha["kv_cache_bytes_per_token"]
    assert inspect_config(compose(["arch=llama"]))["spec"]["n_kv_heads"] == 2


def test_ffn_size_matching_explained():
    from ablate.measure.inspect import inspect_config

    plain = inspect_config(compose(["act=gelu"]))["ffn"]
    gated = inspect_config(compose(["act=geglu"]))["ffn"]
    # 2/3 * 512 = 341.3: 336 is nearer in parameters than 352 (rounding up gave +3.3% FFN weights)
    assert (plain["plain_d_ff"], plain["gated_d_ff"]) == (gated["plain_d_ff"], gated["gated_d_ff"]) == (512, 336)
    assert inspect_config(compose(["act=geglu"]))["spec"]["d_ff"] == 336
    per = gated["ffn_params_per_layer"]
    assert gated["gated_minus_plain_per_layer"] == per["gated"] - per["plain"]
    assert f"{per['gated'] - per['plain']:+,}" in gated["why"]  # the delta is stated, not only computed
    explicit = inspect_config(compose(["act=geglu", "model.d_ff=100"]))
    assert explicit["spec"]["d_ff"] == 100 and "set explicitly" in explicit["ffn"]["why"]


@pytest.mark.parametrize("args, message", [
    (["norm=foo"], "Available options in 'norm': dyt, layernorm, rmsnorm"),
    (["--dtype", "int8"], "--dtype must be one of bf16, fp16, fp32"),
    (["attn=gqa", "model.n_heads=6", "model.n_kv_heads=4"], "not divisible by model.n_kv_heads=4"),
])
def test_bad_input_is_one_line(args, message):
    r = invoke_ablate("inspect", *args)
    assert r.returncode != 0
    assert r.stderr.strip().startswith("error:") and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_under_muon_the_optimizer_table_lists_each_expert_and_mla_matrix_at_its_lr():
    """optim=muon: every parameter once, Muon's LR on an A x B matrix 0.2 * sqrt(max(A, B)) * train.lr
    (match_rms_adamw, Moonlight's rule), AdamW's train.lr; an MoE bank's experts one row each part."""
    args = ["optim=muon", "ffn=moe", "ffn.experts=4", "attn=mla", "pos=rope", "act=swiglu", "train.lr=0.004"]
    r = invoke_ablate("inspect", *args, "--json")
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)["optimizer"]
    rows = {(m["parameter"], m["matrix"]): m for m in o["matrices"]}
    for m in o["matrices"]:
        want = 0.004 * (0.2 * max(m["shape"]) ** 0.5 if m["optimizer"] == "muon" else 1.0)
        assert m["effective_lr"] == pytest.approx(want, rel=1e-12), m
    assert {k[1] for k in rows if k[0] == "blocks.*.ffn.w_in"} == {"each of 4 experts, rows 0:160",
                                                                   "each of 4 experts, rows 160:320"}
    assert rows[("blocks.*.ffn.w_out", "each of 4 experts")]["optimizer"] == "muon"
    assert rows[("blocks.*.ffn.router.weight", "")]["optimizer"] == "adamw"
    assert [rows[("blocks.*.attn.kv_a.weight", x)]["shape"] for x in ("latent", "rope key")] == [[128, 128], [16, 128]]
    text = invoke_ablate("inspect", *args).stdout
    assert "the matrices each optimizer updates" in text and "each of 4 experts, rows 0:160" in text
    assert "optimizer" not in json.loads(invoke_ablate("inspect", "--json").stdout)  # adamw: no table
