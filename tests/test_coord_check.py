"""The coordinate check (ablate/measure/coord_check.py): what it records is the forward pass written out
by hand, its slope is numpy's and scipy's least-squares fit, and on real models it separates the
standard parametrization (activations grow with width) from muP (flat), and CompleteP's residual
stream (flat in depth) from muP's (grows)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ablate.measure.coord_check import (FLAT, SMALL_BATCH, CoordCheck, Module, Request, Sweep, Trace,
                                loglog_slope, measure, slope_of, train_trace)

# Small enough that the four widths x two seeds of one check take seconds on a CPU core.
CHEAP = ("model.n_layers=2", "train.batch_size=4", "train.seq_len=32", "train.device=cpu")
WIDTHS = (64, 128, 256, 512)
DEPTHS = (2, 4, 8)
LATER = (2, 3)  # the steps after an update, where a parametrization's rules show
GROWING = (Module.ATTN_OUT, Module.FFN_OUT, Module.LOGITS)  # what sp grows and muP holds flat


@pytest.fixture(scope="session")
def sp_widths() -> CoordCheck:
    return measure(Request(Sweep.WIDTH, WIDTHS, steps=3, seeds=2, overrides=CHEAP))


@pytest.fixture(scope="session")
def mup_widths() -> CoordCheck:
    """At lr 1e-2, the coord-check LR of nanoGPT-mup (and the mup package's README: "use a large
    learning rate"): at the default 3e-3 the first update is too small beside the readout's init,
    whose logits shrink as width^-1/2 by design, and step 2 still shows it (slope -0.18)."""
    return measure(Request(Sweep.WIDTH, WIDTHS, steps=3, seeds=2, overrides=(*CHEAP, "param=mup", "train.lr=1e-2")))


def depth_check(param: str) -> CoordCheck:
    at_64 = tuple(o for o in CHEAP if not o.startswith("model.n_layers")) + ("model.d_model=64", f"param={param}")
    return measure(Request(Sweep.DEPTH, DEPTHS, steps=3, seeds=2, overrides=at_64))


@pytest.fixture(scope="session")
def mup_depths() -> CoordCheck:
    return depth_check("mup")


@pytest.fixture(scope="session")
def completep_depths() -> CoordCheck:
    return depth_check("completep")


# ---- the slope --------------------------------------------------------------------------------

@pytest.mark.parametrize("true_slope", [-2.0, -0.5, 0.0, 0.3, 1.0, 2.5])
def test_slope_is_the_least_squares_fit_of_numpy_and_scipy(true_slope):
    from scipy.stats import linregress

    rng = np.random.default_rng(int(100 * true_slope) + 1000)
    for n in (3, 4, 7):
        xs = np.sort(rng.uniform(1, 4096, n))
        ys = 0.3 * xs ** true_slope * np.exp(rng.normal(0, 0.2, n))  # a power law with noise
        ours = loglog_slope(xs.tolist(), ys.tolist())
        assert ours == pytest.approx(np.polyfit(np.log(xs), np.log(ys), 1)[0], rel=1e-9, abs=1e-12)
        assert ours == pytest.approx(linregress(np.log2(xs), np.log2(ys)).slope, rel=1e-9, abs=1e-12)


def test_slope_of_a_diverged_value_is_nan_not_a_number():
    assert math.isnan(loglog_slope([64, 128, 256], [0.1, float("inf"), 0.3]))
    assert math.isnan(loglog_slope([64, 128, 256], [0.1, 0.0, 0.3]))


def test_spread_is_the_sample_standard_deviation_over_seeds():
    rng = np.random.default_rng(0)
    traces = []
    for seed in range(4):
        for size in (64, 128, 256):
            traces.append(Trace(size, seed, {Module.LOGITS: [[float(rng.uniform(0.1, 1.0))]]}))
    slope = slope_of(traces, Module.LOGITS, step=1)
    own = [loglog_slope([64, 128, 256], [t.values[Module.LOGITS][0][0] for t in traces if t.seed == s])
           for s in range(4)]
    assert slope.per_seed == pytest.approx(own)
    assert slope.mean == pytest.approx(np.mean(own))
    assert slope.spread == pytest.approx(np.std(own, ddof=1))
    assert slope_of([t for t in traces if t.seed == 0], Module.LOGITS, 1).spread is None


def power_law_check(slopes: dict[Module, list[float]], steps: int) -> CoordCheck:
    """A check whose mean |x| is exactly size^slope at each step (one seed; other modules flat)."""
    from ablate.measure.coord_check import Setting

    sizes = (64, 128, 256)
    traces = [Trace(size, 0, {m: [[size ** slopes.get(m, [0.0] * steps)[i]] for i in range(steps)] for m in Module})
              for size in sizes]
    return CoordCheck(Request(Sweep.WIDTH, sizes, steps, 1), Setting("mup", 64, 3e-3, 4, 64, "cpu", "fp32"), traces)


def test_reading_says_what_the_slopes_after_the_first_update_say():
    check = power_law_check({Module.FFN_OUT: [1.0, 0.9, 1.1, 1.2], Module.ATTN_LOGITS: [-0.5, -0.4, -0.3, -0.2],
                             Module.LOGITS: [-0.5, -0.2, 0.01, -0.02], Module.RESIDUAL: [0.5, 0.1, -0.1, 0.15]}, 4)
    assert check.reading() == (
        "mup, width 64-256, steps 2-4: FFN output grow with width (slope 0.90 to 1.20); attention logits shrink "
        "with width (slope -0.40 to -0.20); output logits flat from step 3 (|slope| <= 0.02; -0.20 before); "
        "embedding output, attention output, FFN hidden, residual stream flat (|slope| <= 0.15)")
    only_init = power_law_check({Module.LOGITS: [-0.5]}, 1)
    assert "step 1: output logits shrink with width (slope -0.50)" in only_init.reading()


# ---- what is recorded --------------------------------------------------------------------------

def by_hand(model, x: torch.Tensor) -> dict[Module, list[float]]:
    """Mean |x| of each module, the default model's forward pass written out (pre-norm blocks,
    learned positions, tied head), attention logits from q and k directly."""
    B, T = x.shape
    h = model.pos.add_to_embeddings(model.tok_emb(x), offset=0)
    out = {m: [] for m in Module}
    out[Module.EMBEDDING].append(h.abs().mean())
    ctx = model.pos.context(T, x.device, h.dtype, offset=0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for block in model.blocks:
        a_in = block.norm1(h)
        attn = block.attn
        q, k, _ = attn.qkv(a_in).split(attn.split, dim=-1)
        q, k = (t.view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2) for t in (q, k))
        scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)  # (B, H, T, T)
        out[Module.ATTN_LOGITS].append(scores[..., causal].abs().mean())
        a = attn(a_in, ctx)
        f_in = block.norm2(h + a)
        out[Module.FFN_HIDDEN].append(block.ffn.act(block.ffn.up(f_in)).abs().mean())  # gelu: act(up x)
        f = block.ffn(f_in)
        h = h + a + f
        out[Module.ATTN_OUT].append(a.abs().mean())
        out[Module.FFN_OUT].append(f.abs().mean())
        out[Module.RESIDUAL].append(h.abs().mean())
    out[Module.LOGITS].append(F.linear(model.final_norm(h), model.tok_emb.weight).abs().mean())
    return {m: [float(v) for v in vs] for m, vs in out.items()}


def test_each_step_records_the_forward_pass_on_that_steps_batch_after_the_updates_before_it():
    """Step 1 is the model at init on batch 0; step s is the model after s - 1 AdamW updates at
    the constant train.lr, on batch s - 1 of the run's paired order."""
    from ablate.config.compose import compose_config
    from ablate.data.batches import Batches
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.launch import prepare_data
    from ablate.train.optimizer import build_optimizer

    cfg = compose_config([*SMALL_BATCH, *CHEAP, "model.d_model=32", "model.n_heads=2"])
    tok, data = prepare_data(cfg, progress=False)
    spec = ModelSpec.from_config(cfg, tokenizer_vocab=tok.vocab_size)
    batches = Batches(data.train, cfg.train.seq_len, cfg.train.batch_size, data_seed=cfg.data_seed)
    model = build_model(spec, seed=0)
    trace = train_trace(model, build_optimizer(model, cfg.train, torch.device("cpu")), batches, steps=3)

    ref = build_model(spec, seed=0)
    opt = build_optimizer(ref, cfg.train, torch.device("cpu"))
    for step in range(3):
        x, y = batches.get(step)
        with torch.no_grad():
            want = by_hand(ref, x)
        for m in Module:
            assert trace.values[m][step] == pytest.approx(want[m], rel=1e-4), (m, step + 1)
        assert len(trace.values[Module.RESIDUAL][step]) == spec.n_layers
        loss = F.cross_entropy(ref(x).logits.reshape(-1, spec.vocab_size), y.reshape(-1))
        assert trace.loss[step] == pytest.approx(loss.item(), rel=1e-5)
        opt.zero_grad()
        loss.backward()  # no clipping, the same lr every step
        opt.step()


# ---- on real models ----------------------------------------------------------------------------

def test_sp_sublayer_outputs_and_logits_grow_with_width(sp_widths):
    """The standard parametrization under Adam: an update moves every weight by about lr
    whatever the width, so a layer's output moves in proportion to its fan-in."""
    for m in GROWING:
        for step in LATER:
            assert sp_widths.slope(m, step).mean >= 0.5, (m, step, sp_widths.slope(m, step))
    assert "grow with width" in sp_widths.reading()
    assert sp_widths.reading().startswith("sp, width 64-512, steps 2-3: ")


def test_mup_sublayer_outputs_are_flat_with_width(mup_widths):
    """muP's hidden LR x base_fan_in/fan_in cancels the fan-in's sum; the logits' multiplier
    base_width/width does the same for the readout once an update has moved it."""
    for m in (Module.ATTN_OUT, Module.FFN_OUT):
        for step in LATER:
            assert abs(mup_widths.slope(m, step).mean) <= FLAT, (m, step, mup_widths.slope(m, step))
    assert abs(mup_widths.slope(Module.LOGITS, 3).mean) <= FLAT, mup_widths.slope(Module.LOGITS, 3)
    assert mup_widths.reading().startswith("mup, width 64-512, steps 2-3: ")
    assert mup_widths.setting.base == 64


def test_mup_logits_are_flat_with_width_after_one_update(mup_widths):
    """The logits' init part shrinks as width^-1/2 (step 1); one update at a coord-check LR
    outweighs it (the mup package's README: a transient of the init)."""
    assert abs(mup_widths.slope(Module.LOGITS, 1).mean + 0.5) <= FLAT, mup_widths.slope(Module.LOGITS, 1)
    assert abs(mup_widths.slope(Module.LOGITS, 2).mean) <= FLAT, mup_widths.slope(Module.LOGITS, 2)


def test_mup_residual_stream_grows_with_depth_and_completep_takes_the_growth_away(mup_depths, completep_depths):
    """Without a depth rule each of L blocks adds an update of the same size: the residual
    stream grows with depth. CompleteP scales each branch by base_depth/L."""
    for step in LATER:
        grows, cp = mup_depths.slope(Module.RESIDUAL, step), completep_depths.slope(Module.RESIDUAL, step)
        assert grows.mean >= 0.5, (step, grows)
        assert cp.mean <= grows.mean - 0.5, (step, cp, grows)
    assert "residual stream grow with depth" in mup_depths.reading()


def test_completep_residual_stream_is_flat_with_depth(completep_depths):
    """The final residual stream, as Dey et al. 2025 (Fig. 7) plot it: at init the branches'
    sum, each x base_depth/L, falls as L^-1/2 beside the embedding; once the updates, summed
    over L blocks x base_depth/L, outweigh it, the stream is flat."""
    assert completep_depths.slope(Module.RESIDUAL, 1).mean < -FLAT, completep_depths.slope(Module.RESIDUAL, 1)
    for step in LATER:
        assert abs(completep_depths.slope(Module.RESIDUAL, step).mean) <= FLAT, completep_depths.slope(Module.RESIDUAL, step)


def test_the_embedding_output_is_flat_with_width_under_sp(sp_widths):
    """A lookup's rows do not sum over the width: no parametrization makes them grow."""
    for step in (1, *LATER):
        assert abs(sp_widths.slope(Module.EMBEDDING, step).mean) <= FLAT
    assert "embedding output flat" in sp_widths.reading()


def test_json_holds_every_value_and_slope(sp_widths):
    record = sp_widths.to_json()
    n_layers = 2
    assert len(record["values"]) == len(WIDTHS) * 2 * 3 * len(Module)
    for v in record["values"]:
        per_layer = Module(v["module"]) not in (Module.EMBEDDING, Module.LOGITS)
        assert len(v["layers"]) == (n_layers if per_layer else 1)
        final = Module(v["module"]) is Module.RESIDUAL  # the final residual stream: the last block's
        assert v["mean"] == pytest.approx(v["layers"][-1] if final else np.mean(v["layers"]))
    for s in record["slopes"]:  # each slope recomputed from the record's own values
        per_seed = [np.polyfit(np.log(WIDTHS), np.log([v["mean"] for v in record["values"] if v["seed"] == seed
                                                       and v["step"] == s["step"] and v["module"] == s["module"]]), 1)[0]
                    for seed in (0, 1)]
        assert s["per_seed"] == pytest.approx(per_seed)
        assert s["spread"] == pytest.approx(np.std(per_seed, ddof=1))
    assert record["param"] == "sp" and record["base"] is None and record["lr"] == 3e-3


def test_plot_has_a_panel_per_step_and_a_line_per_module_on_log_axes(sp_widths):
    from ablate.tracking.coord_plots import coord_figure

    fig = coord_figure(sp_widths)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["t=1", "t=2", "t=3"]
    for ax in panels:
        assert len(ax.lines) == len(Module)
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert list(ax.lines[0].get_xdata()) == list(WIDTHS)
    assert [t.get_text() for t in panels[0].get_legend().get_texts()] == [m.label for m in Module]


def test_a_sweep_with_rules_takes_the_smallest_size_as_its_base_unless_given():
    from ablate.measure.coord_check import size_overrides

    r = Request(Sweep.WIDTH, (64, 128, 256), 2, 1, ("param=mup",))
    assert size_overrides(r, 256, "mup", base_set=False)[-2:] == ["model.d_model=256", "model.base_width=64"]
    assert size_overrides(r, 256, "mup", base_set=True)[-1] == "model.d_model=256"
    assert size_overrides(r, 256, "sp", base_set=False)[-1] == "model.d_model=256"
    d = Request(Sweep.DEPTH, (2, 4, 8), 2, 1, ("param=completep",))
    assert size_overrides(d, 8, "completep", base_set=False)[-2:] == ["model.n_layers=8", "model.base_depth=2"]
