"""Loss at other context lengths (ablate/evaluation/lengths.py) against a brute-force computation token by
token, and RoPE scaling against its formulas in NumPy."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ablate.errors import ConfigError
from ablate.evaluation.length_record import EvalKey, EvalStatus, LengthRecord, LengthResult, read_lengths
from ablate.evaluation.lengths import EvalData, evaluate_key, evaluate_run, parse_lengths, windows
from ablate.model.positions import RopeScaling
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer

CPU = torch.device("cpu")
SCORED = 50  # the validation tokens scored (train.eval_tokens)


def tiny_model(pos: str, max_seq_len: int = 16) -> Transformer:
    """A random model whose predictions depend clearly on the context (init_std 0.3)."""
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=48,
                     max_seq_len=max_seq_len, pos=pos, init_std=0.3, init="normal")
    torch.manual_seed(0)
    return Transformer(spec, seed=0).eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Hundreds of tiny forward passes: threads would only wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data() -> EvalData:
    rng = np.random.default_rng(0)
    val = rng.integers(0, 64, size=300).astype(np.uint16)
    byte_lengths = rng.integers(1, 4, size=64).astype(np.int64)
    return EvalData(val, byte_lengths, eval_tokens=SCORED, batch_tokens=40)


def context_start(t: int, length: int, stride) -> int:
    """Where the context of target t (1 .. SCORED) begins, from the protocol's definition."""
    if stride is None:
        return (t - 1) // length * length  # its non-overlapping window's start
    if t <= length:
        return 0  # the first window, scored whole
    end = min(length + stride * math.ceil((t - length) / stride), SCORED)  # the window scoring t
    return end - length


@torch.no_grad()
def brute_force(model, data: EvalData, length: int, stride=None) -> tuple[float, float]:
    """(loss, bpb): each scored token alone, from its own context, one forward pass per token."""
    nats = 0.0
    tokens = torch.from_numpy(data.val.astype(np.int64))
    for t in range(1, SCORED + 1):
        ctx = tokens[context_start(t, length, stride): t][None]
        nats -= F.log_softmax(model(ctx).logits[0, -1].double(), -1)[tokens[t]].item()
    n_bytes = int(data.byte_lengths[data.val[1: SCORED + 1]].sum())
    return nats / SCORED, nats / (math.log(2) * n_bytes)


def scored_targets(ws: list[tuple]) -> list[int]:
    out = []
    for start, n, *scored in ws:
        k = scored[0] if scored else n
        out += range(start + n - k + 1, start + n + 1)
    return out


@pytest.mark.parametrize("length,stride", [(1, None), (3, None), (8, None), (16, None), (50, None),
                                           (8, 1), (8, 3), (16, 5), (16, 15), (50, 7)])
def test_every_protocol_scores_the_same_tokens_once(data, length, stride):
    ws = windows(data.val, length, data.eval_tokens, stride)
    assert scored_targets(ws) == list(range(1, SCORED + 1))
    assert all(n == length for _, n, *_ in ws[1:]) or stride is None  # sliding: full windows
    assert data.scored_tokens == SCORED


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "nope"])
@pytest.mark.parametrize("length,stride", [(8, None), (16, 5), (8, 3)])
def test_loss_and_bpb_equal_the_brute_force(data, pos, length, stride):
    model = tiny_model(pos)
    r = evaluate_key(model, EvalKey(length, stride), data, CPU, contextlib.nullcontext, step=7)
    loss, bpb = brute_force(model, data, length, stride)
    assert r.status == EvalStatus.OK and r.scored_tokens == SCORED and r.step == 7
    assert r.loss == pytest.approx(loss, rel=1e-5) and r.bpb == pytest.approx(bpb, rel=1e-5)


def test_protocols_differ_where_the_context_does(data):
    """The brute force tells the protocols apart: the comparison above can fail."""
    model = tiny_model("alibi")
    windowed = evaluate_key(model, EvalKey(8), data, CPU, contextlib.nullcontext, None).loss
    assert abs(windowed - brute_force(model, data, 8, 3)[0]) > 1e-3
    assert abs(windowed - brute_force(model, data, 16)[0]) > 1e-3


@pytest.mark.parametrize("pos", ["sinusoidal", "rope", "alibi", "nope"])
def test_any_length_beyond_the_model_table(data, pos):
    """max_seq_len=16: evaluated at 48 (3x), against the brute force at that context."""
    model = tiny_model(pos, max_seq_len=16)
    r = evaluate_key(model, EvalKey(48), data, CPU, contextlib.nullcontext, None)
    assert r.status == EvalStatus.OK
    assert r.loss == pytest.approx(brute_force(model, data, 48)[0], rel=1e-5)


def test_learned_table_is_na_past_its_rows_and_the_rest_goes_on(data, tmp_path):
    model = tiny_model("learned", max_seq_len=16)
    keys = [EvalKey(8), EvalKey(16), EvalKey(32), EvalKey(32, stride=4)]
    ev = evaluate_run(tmp_path, model, 8, keys, data, step=3)
    statuses = [r.status for r in ev.results]
    assert statuses == [EvalStatus.OK, EvalStatus.OK, EvalStatus.NOT_AVAILABLE, EvalStatus.NOT_AVAILABLE]
    na = ev.results[2]
    assert na.loss is None and "16 position rows" in na.reason and "\n" not in na.reason
    assert [r.key for r in read_lengths(tmp_path).results] == sorted(keys, key=lambda k: (k.stride or 0, k.length))


def test_a_length_longer_than_the_scored_tokens_is_na(data):
    r = evaluate_key(tiny_model("rope"), EvalKey(SCORED + 1), data, CPU, contextlib.nullcontext, None)
    assert r.status == EvalStatus.NOT_AVAILABLE and "only 50 validation tokens" in r.reason


def test_results_are_keyed_and_additive(data, tmp_path):
    model = tiny_model("rope")
    first = evaluate_run(tmp_path, model, 8, [EvalKey(8), EvalKey(16)], data, step=3)
    assert not first.stored
    with torch.no_grad():  # other weights under the same step: a stored result is returned as stored
        model.tok_emb.weight.mul_(2)
    again = evaluate_run(tmp_path, model, 8, [EvalKey(16), EvalKey(16, rope_scaling="pi:2.0")], data, step=3)
    assert again.stored == {EvalKey(16)}
    assert again.results[0].loss == first.results[1].loss
    record = read_lengths(tmp_path)
    assert len(record.results) == 3
    later = evaluate_run(tmp_path, model, 8, [EvalKey(16)], data, step=9)  # trained further: evaluated
    assert not later.stored and later.results[0].loss != first.results[1].loss
    assert [r.step for r in read_lengths(tmp_path).results if r.key == EvalKey(16)] == [9]


def test_record_round_trips_through_json():
    record = LengthRecord(64, [LengthResult(EvalKey(128, 32, "ntk:4.0"), EvalStatus.OK, 1.5, 2.1, 512, 30),
                               LengthResult(EvalKey(512), EvalStatus.NOT_AVAILABLE, scored_tokens=512,
                                            reason="why")])
    assert LengthRecord.from_json(record.to_json()) == record


# ---- RoPE scaling --------------------------------------------------------------------------------
def numpy_angles(T: int, d: int, base: float, divisor: float = 1.0) -> np.ndarray:
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.outer(np.arange(T) / divisor, theta)
    return np.concatenate([angles, angles], axis=1)


def formula_angles(kind: str, factor: float, T: int, d: int, base: float) -> np.ndarray:
    """pi (Chen et al. 2023): positions / F; ntk: base * F^(d/(d-2))."""
    if kind == "pi":
        return numpy_angles(T, d, base, divisor=factor)
    return numpy_angles(T, d, base * factor ** (d / (d - 2)))


@pytest.mark.parametrize("kind", ["pi", "ntk"])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 7.5])
def test_rope_scaling_turns_by_its_formula(kind, factor):
    model = tiny_model("rope")
    d, base = model.spec.head_dim, model.spec.rope_base
    model.pos.scaling = RopeScaling.parse(f"{kind}:{factor}")
    cos, sin = model.pos.context(40, CPU, torch.float32).rope
    expected = formula_angles(kind, factor, 40, d, base)
    np.testing.assert_allclose(cos.numpy(), np.cos(expected), atol=1e-5)
    np.testing.assert_allclose(sin.numpy(), np.sin(expected), atol=1e-5)


@pytest.mark.parametrize("factor", [2.0, 4.0, 7.5])
def test_ntk_keeps_the_fastest_rotation_and_slows_the_slowest_by_the_factor(factor):
    d, base = 8, 10000.0
    ntk, plain = formula_angles("ntk", factor, 40, d, base), numpy_angles(40, d, base)
    np.testing.assert_allclose(ntk[:, 0], plain[:, 0])
    np.testing.assert_allclose(ntk[:, d // 2 - 1] * factor, plain[:, d // 2 - 1], rtol=1e-12)


def test_rope_scaling_holds_only_during_its_evaluation(data):
    model = tiny_model("rope")
    plain = evaluate_key(model, EvalKey(16), data, CPU, contextlib.nullcontext, None).loss
    scaled = evaluate_key(model, EvalKey(16, rope_scaling="pi:2.0"), data, CPU, contextlib.nullcontext, None)
    assert scaled.key.rope_scaling == "pi:2.0" and scaled.loss != pytest.approx(plain, rel=1e-4)
    assert model.pos.scaling is None
    assert evaluate_key(model, EvalKey(16), data, CPU, contextlib.nullcontext, None).loss == plain
    identity = evaluate_key(model, EvalKey(16, rope_scaling="ntk:1.0"), data, CPU, contextlib.nullcontext, None)
    assert identity.loss == pytest.approx(plain, rel=1e-6)


@pytest.mark.parametrize("text", ["pi", "pi:", "yarn:2", "pi:abc", "ntk:0.5", "pi:0", "pi:-2", "pi:nan", "pi:inf"])
def test_rope_scaling_refuses_bad_syntax_and_factors_below_one(text):
    with pytest.raises(ValueError) as e:
        RopeScaling.parse(text)
    assert "\n" not in str(e.value) and "--rope-scaling" in str(e.value)


def test_rope_scaling_key_is_canonical():
    assert str(RopeScaling.parse("pi:2")) == "pi:2.0" and str(RopeScaling.parse(" ntk:4.5 ")) == "ntk:4.5"


@pytest.mark.parametrize("text", ["", "0", "-8", "12.5", "abc", "64,,128", "64,0"])
def test_bad_lengths_are_one_line(text):
    with pytest.raises(ConfigError) as e:
        parse_lengths(text)
    assert "\n" not in str(e.value) and "--lengths" in str(e.value)


def test_lengths_parse_sorted_and_unique():
    assert parse_lengths("512, 64,128,64") == [64, 128, 512]
