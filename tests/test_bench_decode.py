"""`ablate bench --decode`: generation with a KV cache, per batch size: prefill tokens/s, time to
first token, decode tokens/s aggregate and per stream, the cache's bytes measured from its
tensors (equal to `ablate inspect`'s formula at the compute dtype), peak memory; variants
alternate with the baseline round by round. Speeds are checked for their arithmetic, never
for their size: timings on a shared machine are noise. How sure each figure is, from its rounds,
is checked with a scripted clock: rounds that disagree are marked, rounds that agree are not."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from ablate.measure import decode_bench as d
from ablate.measure.bench_report import decode_table
from ablate.measure.rounds import spread
from ablate.measure.inspect import inspect_config
from compare_fixtures import cli
from conftest import compose, run_ablate

DIMS = ["model.d_model=32", "model.n_heads=4", "model.n_layers=2", "train.device=cpu", "train.threads=1"]
SHORT = ["--context", "6", "--new-tokens", "3", "--rounds", "2", "--warmup", "1"]
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}  # attn=gqa on 4 heads: 2 KV heads


def test_the_report_holds_each_batch_sizes_figures_and_their_arithmetic():
    cfg = compose(DIMS)
    r = d.bench_decode(cfg, [1, 3], context=6, new_tokens=3, rounds=2, warmup=1)
    assert (r["mode"], r["context"], r["new_tokens"], r["rounds"], r["precision"]) == ("decode", 6, 3, 2, "fp32")
    assert [row["batch"] for row in r["rows"]] == [1, 3]
    weights = sum(p.numel() for p in d.build_decode_model(cfg, 9).model.parameters()) * 4
    assert r["params"] * 4 == weights and r["weights_bytes"] >= weights  # fp32; buffers on top
    for row in r["rows"]:
        b = row["batch"]
        assert row["prefill_tokens_per_s"] > 0 and row["decode_tokens_per_s_per_stream"] > 0
        # aggregate: every stream of the batch; per stream: one sequence; the same timed rounds
        assert row["decode_tokens_per_s_aggregate"] == pytest.approx(b * row["decode_tokens_per_s_per_stream"])
        assert row["decode_ms_per_step"] == pytest.approx(1e3 / row["decode_tokens_per_s_per_stream"])
        assert row["prefill_tokens_per_s"] * row["time_to_first_token_ms"] / 1e3 == pytest.approx(b * 6)
        assert row["kv_cache_bytes"] == row["kv_cache_bytes_per_token"] * b * (6 + 3)
        # CPU: the cache and the weights, as the report says
        assert row["peak_memory_bytes"] == row["kv_cache_bytes"] + r["weights_bytes"]
    assert "KV cache + weights" in r["peak_memory_kind"]


@pytest.mark.parametrize("precision, width", [("fp32", 4), ("bf16", 2)])
@pytest.mark.parametrize("attn", sorted(KV_HEADS))
def test_kv_bytes_measured_from_the_cache_equal_inspects_formula(attn, precision, width):
    overrides = DIMS + [f"attn={attn}", f"train.precision={precision}"]
    r = d.bench_decode(compose(overrides), [2], context=5, new_tokens=2, rounds=1, warmup=1)
    row = r["rows"][0]
    by_hand = 2 * 2 * KV_HEADS[attn] * (32 // 4) * width  # K and V x layers x KV heads x head_dim x bytes
    assert row["kv_cache_bytes"] == by_hand * 2 * (5 + 2)  # batch x positions
    assert row["kv_cache_bytes_per_token"] == by_hand == r["kv_cache_formula_bytes_per_token"]
    assert inspect_config(compose(overrides), dtype=precision)["kv_cache_bytes_per_token"] == by_hand
    assert r["precision"] == precision


def test_mla_decodes_absorbed_against_plain_from_a_cache_of_its_latent_and_rope_key():
    """attn=mla (head_dim 8: kv_rank 32, rope_dim 4) with --vs attn.decode=plain: the same cache,
    (kv_rank + rope_dim) x layers x 4 bytes per token, both ways (fp32)."""
    mla = DIMS + ["attn=mla", "pos=rope"]
    r = d.bench_decode_variants(mla, [("attn.decode=plain", ["attn.decode=plain"])], [2], context=5, new_tokens=2,
                                rounds=1, warmup=1)
    row = r["rows"][0]
    assert row["kv_cache_bytes_per_token"] == row["baseline"]["kv_cache_bytes_per_token"] == (32 + 4) * 2 * 4
    assert row["kv_cache_ratio"] == 1 and row["ratio"] > 0
    assert inspect_config(compose(mla), dtype="fp32")["kv_cache_bytes_per_token"] == (32 + 4) * 2 * 4


def test_generation_decodes_one_token_per_sequence_per_step_into_its_cache():
    dm = d.build_decode_model(compose(DIMS), 10)
    gen = d.Generation("x", dm, batch=3, context=7, new_tokens=3, clock=lambda: 0.0)
    token = gen()
    assert token.shape == (3, 1) and gen.cache.length == 7 + 3 == gen.cache.capacity
    assert gen.cache.layers[0].k.dtype == torch.float32 and len(gen.prefill_s) == len(gen.decode_s) == 1


def test_the_prefill_picks_the_first_token_from_the_last_positions_logits():
    from ablate.model.kv_cache import KVCache

    model = d.build_decode_model(compose(DIMS), 16).model
    prompt = torch.randint(0, model.spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = model.decode(prompt, KVCache.for_model(model, 2, 9))
        last = model.decode(prompt, KVCache.for_model(model, 2, 9), last=True)
    assert last.shape == (2, 1, full.shape[-1]) and torch.allclose(last, full[:, -1:], atol=1e-6)


def test_only_attn_alternates_each_option_with_the_baseline(monkeypatch):
    order = []
    call = d.Generation.__call__

    def logged(self, step=0):
        order.append((self.label, self.batch))
        return call(self, step)

    monkeypatch.setattr(d.Generation, "__call__", logged)
    res = cli("bench", "--decode", *DIMS, "--batch", "1,2", *SHORT, "--rounds", "4", "--axes", "--only", "attn", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("{"):])["rows"]
    assert [(r["variant"], r["batch"]) for r in rows] == [("attn=gqa", 1), ("attn=gqa", 2), ("attn=mla", 1), ("attn=mla", 2),
                                                          ("attn=mqa", 1), ("attn=mqa", 2)]
    base, timed = "baseline", 2 * 4  # a warm-up of each, then 4 rounds of both
    for i, (variant, batch) in enumerate((r["variant"], r["batch"]) for r in rows):
        pair = order[i * (2 + timed):(i + 1) * (2 + timed)]
        assert {b for _, b in pair} == {batch}
        assert [label for label, _ in pair] == [base, variant] + [base, variant, variant, base] * 2  # ABBA
    # MHA's 2 x 4 x 8 numbers per layer and token against each one's (MLA without rope: its latent, 4 x 8)
    cached = {**{attn: 2 * n * 8 for attn, n in KV_HEADS.items()}, "mla": 4 * 8}
    for r in rows:
        assert r["kv_cache_ratio"] == cached["mha"] / cached[r["variant"].split("=")[1]]
        assert r["baseline"]["kv_cache_bytes"] == r["kv_cache_ratio"] * r["kv_cache_bytes"]
        assert r["ratio"] > 0 and len(r["round_ratios"]) == 4 and r["prefill_ratio"] > 0
        assert r["ratio_spread"] == pytest.approx(spread(r["round_ratios"]).relative)


def test_the_cli_prints_the_table_and_json_names_the_public_keys():
    res = cli("bench", "--decode", *DIMS, "--batch", "2", *SHORT)
    assert res.exit_code == 0, res.output
    for words in ("prefill tokens/s", "time to first token", "decode tokens/s aggregate", "decode tokens/s per stream",
                  "KV bytes/token", "peak memory", "at context 9 (prompt + decode steps)",
                  "`ablate inspect`'s formula at fp32 and that context: 512 bytes/token"):
        assert words in " ".join(res.stdout.split()), words
    r = json.loads(cli("bench", "--decode", *DIMS, "--batch", "2", *SHORT, "--json").stdout)
    assert set(r["rows"][0]) == {"batch", "prefill_tokens_per_s", "time_to_first_token_ms",
                                 "decode_tokens_per_s_aggregate", "decode_tokens_per_s_per_stream",
                                 "decode_ms_per_step", "kv_cache_bytes", "kv_cache_bytes_per_token",
                                 "peak_memory_bytes", "prefill_ms_per_round", "decode_ms_per_round",
                                 "prefill_spread", "decode_spread"}
    assert r["spread_limit"] == 0.1 and len(r["rows"][0]["decode_ms_per_round"]) == 2


def test_the_context_defaults_to_the_training_length_less_the_new_tokens():
    r = json.loads(cli("bench", "--decode", *DIMS, "train.seq_len=20", "--batch", "1", "--new-tokens", "4",
                       "--rounds", "1", "--warmup", "1", "--json").stdout)
    assert (r["context"], r["new_tokens"]) == (16, 4)


@pytest.mark.parametrize("args, message", [
    (["--decode", "--batch", "0"], "--batch takes a list of integers >= 1"),
    (["--decode", "--batch", "1,x"], "--batch takes a list of integers >= 1"),
    (["--decode", "--batch", ","], "--batch takes a list of integers >= 1"),
    (["--decode", "--context", "0"], "--context must be >= 1, got 0"),
    (["--decode", "--new-tokens", "0"], "--new-tokens must be >= 1, got 0"),
    (["--decode", "--new-tokens", "-3"], "--new-tokens must be >= 1, got -3"),
    (["--decode", "--rounds", "0"], "--rounds must be >= 1"),
    (["--batch", "8"], "--batch, --context and --new-tokens go with --decode"),
    (["--decode", "--reference"], "use them without --decode"),
    (["--decode", "--jobs-per-device", "1,2"], "use them without --decode"),
    (["--decode", "--only", "attn"], "--only selects rows of --axes"),
    (["--decode", "--context", "60", "--new-tokens", "8", "pos=learned", "model.max_seq_len=64", "train.seq_len=32"],
     "--context + --new-tokens = 68 positions, past the 64 of pos=learned (model.max_seq_len)"),
    (["--decode", "--new-tokens", "40", "train.seq_len=32"], "--new-tokens 40 leaves no prompt within train.seq_len=32"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    res = cli("bench", *DIMS, *args)
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: ") and message in res.stderr
    assert res.stdout == ""


def test_bad_input_in_a_real_process_is_one_line_without_traceback():
    res = run_ablate("bench", *DIMS, "--decode", "--batch", "8,0")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == ["error: --batch takes a list of integers >= 1, e.g. 1,8,32"]


def scripted_clock(prefill: list, decode: list):
    """A clock under which round i (the warm-up first) takes prefill[i] and decode[i] seconds:
    a round reads it at its start and end (Contender.run) and at the generation's start, after
    its prefill and after its decode (Generation)."""
    times, t = [], 0.0
    for p, q in zip(prefill, decode):
        times += [t, t, t + p, t + p + q, t + p + q]
        t += p + q + 1.0
    ticks = iter(times)
    return lambda: next(ticks)


@pytest.mark.parametrize("decode_s, disagree", [
    ([0.2, 0.100, 0.102, 0.099, 0.101, 0.100], False),  # ±1.5%
    ([0.2, 0.100, 0.100, 0.500, 0.100, 0.020], True),  # one round 5x slower, one 5x faster
])
def test_decode_figures_whose_rounds_disagree_are_marked(monkeypatch, decode_s, disagree):
    prefill_s = [0.05, 0.010, 0.010, 0.0101, 0.0099, 0.010]  # agree: ±1%
    monkeypatch.setattr(d, "tick_clock", lambda name, device: scripted_clock(prefill_s, decode_s))
    r = d.bench_decode(compose(DIMS), [2], context=4, new_tokens=3, rounds=5, warmup=1)
    row, timed = r["rows"][0], decode_s[1:]  # the warm-up round is not counted
    assert row["decode_ms_per_round"] == pytest.approx([1e3 * x for x in timed])
    # 5 rounds: the median's interval is their range (it holds the median with probability 15/16)
    assert row["decode_spread"] == pytest.approx((max(timed) - min(timed)) / (2 * statistics.median(timed)))
    assert row["prefill_spread"] == pytest.approx(0.0002 / (2 * 0.010))
    assert row["decode_tokens_per_s_aggregate"] == pytest.approx(2 * 3 / statistics.median(timed))
    table = decode_table(r)
    cells = {c.head: c.cell(table.rows[0]) for c in table.columns}
    decode_cells = [cells["decode tokens/s aggregate"], cells["decode tokens/s per stream"], cells["spread decode"]]
    assert [x.endswith("*") for x in decode_cells] == [disagree] * 3
    assert not cells["prefill tokens/s"].endswith("*") and not cells["time to first token"].endswith("*")
    assert any(n.startswith("*: its rounds disagree") for n in table.notes) == disagree
