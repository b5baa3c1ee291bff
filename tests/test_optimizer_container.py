"""The run's optimizers behind one container (ablate/train/optimizer.py, ablate/train/optimizers/):
which parameters each optimizer takes and at which LR and decay, checkpoints (a checkpoint from
before the container resumes bit-exactly; another optimizer's is refused in one line), the state
bytes the micro-batch probe adds, the compiled step, the update RMS in diagnostics rows, and a
run killed under Muon that resumes to the uninterrupted run's losses."""

from __future__ import annotations

import math
import signal

import pytest
import torch
from omegaconf import OmegaConf

from ablate.model.roles import DECAY, Role, role_of
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer
from ablate.train.optimizer import build_optimizer, set_lr, state_bytes
from ablate.train.optimizers.matrices import muon_matrices
from ablate.train.optimizers.optim_settings import OptimSpec
from conftest import TINY, compose, loss_curve, read_jsonl, read_summary, run_ablate, scripted_trainer, stop_after_first_checkpoint

TRAIN = OmegaConf.create(dict(lr=0.01, weight_decay=0.1, beta1=0.9, beta2=0.95, compile_optimizer=False))
SPEC = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=16,
                 act="swiglu", tied=False, mtp_heads=1)


pytestmark = pytest.mark.usefixtures("one_thread")


def owners(optimizer) -> dict[int, tuple[str, dict]]:
    return {id(p): (name, g) for name, part in optimizer.parts.items() for g in part.param_groups for p in g["params"]}


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest_each_with_the_role_decay():
    model = Transformer(SPEC)
    opt = build_optimizer(model, TRAIN, torch.device("cpu"), OptimSpec(name="muon"))
    owner = owners(opt)
    params = {n: p for n, p in model.named_parameters()}
    assert set(owner) == {id(p) for p in params.values()}  # every parameter, each in one part
    for name, p in params.items():
        part, group = owner[id(p)]
        hidden = role_of(p) in (Role.INPUT, Role.OUTPUT)  # qkv, proj, gate_up, down, the MTP projection
        assert part == ("muon" if hidden else "adamw"), name
        assert group["weight_decay"] == (0.1 if DECAY[role_of(p)] else 0.0), name  # gains, biases: never
        assert group["lr"] == 0.01, name
    assert {role_of(params[n]) for n in params if owner[id(params[n])][0] == "adamw"} == {
        Role.EMBEDDING, Role.POSITION, Role.HEAD, Role.GAIN, Role.BIAS}
    assert [g["name"] for g in opt.parts["muon"].param_groups] == ["muon.input", "muon.output"]
    # under optim=adamw: one AdamW over everything, the groups it always had
    plain = build_optimizer(model, TRAIN, torch.device("cpu"))
    assert list(plain.parts) == ["adamw"] and [g["name"] for g in plain.param_groups] == ["decay", "no_decay"]


def test_mup_keeps_muadams_lr_rules_on_muon_and_original_moves_adamw_at_its_ratio():
    import dataclasses

    wide = Transformer(dataclasses.replace(SPEC, d_model=64, d_ff=96, param="mup", base_width=32, base_d_ff=48))
    opt = build_optimizer(wide, TRAIN, torch.device("cpu"), OptimSpec(name="muon"))
    owner = owners(opt)
    for name, p in wide.named_parameters():
        rule = wide.param_rules[name]
        part, group = owner[id(p)]
        assert group["lr"] == pytest.approx(0.01 * rule.lr_mult), name  # 1/2 on hidden matrices
        if part == "muon":
            assert rule.lr_mult == 0.5 and group["weight_decay"] == pytest.approx(0.1 * rule.wd_mult), name
    original = OptimSpec(name="muon", adjust="original", adam_lr=0.003)
    opt = build_optimizer(Transformer(SPEC), OmegaConf.merge(TRAIN, {"lr": 0.02}), torch.device("cpu"), original)
    set_lr(opt, 0.01)  # the schedule halfway down: both parts at half their LR
    assert {g["lr"] for g in opt.parts["muon"].param_groups} == {0.01}
    assert {round(g["lr"], 12) for g in opt.parts["adamw"].param_groups} == {0.0015}


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_probe_counts_the_state_bytes_the_optimizers_allocate(name):
    """What the micro-batch probe adds to its measurement (before the state exists) equals the
    state after one step: AdamW two moments per parameter, Muon one momentum buffer."""
    from ablate.train.microbatch import resolve_micro_batch

    model = Transformer(SPEC)
    opt = build_optimizer(model, TRAIN, torch.device("cpu"), OptimSpec(name=name))
    model(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long)).loss.backward()
    opt.step()
    allocated = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.ndim > 0)
    assert state_bytes(model, OptimSpec(name=name)) == allocated
    seen = []
    import ablate.train.microbatch as microbatch

    original, microbatch.cuda_fits = microbatch.cuda_fits, lambda *a: seen.append(a[-1]) or True
    try:
        cfg = OmegaConf.create(dict(batch_size=4, grad_accum=1, micro_batch="auto", seq_len=8))
        assert resolve_micro_batch(cfg, model, torch.device("cuda"), None, allocated) == 4
    finally:
        microbatch.cuda_fits = original
    assert seen == [allocated]


def _stop_at(step_to_stop: int, trainer_ref: list):
    def losses(step):
        if step == step_to_stop - 1:
            trainer_ref[0].stop.signum = signal.SIGTERM
    return losses


def test_a_checkpoint_from_before_the_container_resumes_bit_exactly_or_is_refused(tmp_path):
    """A checkpoint whose optimizer entry is one AdamW's state_dict (what main wrote before the
    container) continues the uninterrupted curve exactly under optim=adamw; under optim=muon it
    is refused in one line."""
    from ablate.errors import CheckpointError
    from ablate.train import checkpoint

    steps = ["train.steps=10", "train.warmup_steps=2"]
    whole = scripted_trainer(tmp_path / "whole", *steps)
    assert whole.fit().status == "completed"
    ref: list = [None]
    ref[0] = half = scripted_trainer(tmp_path / "run", *steps, losses=_stop_at(5, ref))
    assert (half.fit().step, half.state.step) == (5, 5)
    (step, path), = checkpoint.list_checkpoints(tmp_path / "run")
    state = checkpoint.load_file(path)
    legacy = state["optimizer"]["optimizers"]["adamw"]
    assert set(legacy) == {"state", "param_groups"}  # torch's AdamW.state_dict(), as main saved it
    checkpoint.save(tmp_path / "run", step, {**state, "optimizer": legacy})
    again = scripted_trainer(tmp_path / "run", *steps)
    assert again.fit(again.try_resume()).status == "completed"
    assert loss_curve(again, grad_norm=True) == loss_curve(whole, grad_norm=True)[10:]
    muon = scripted_trainer(tmp_path / "run", *steps, "optim=muon")
    with pytest.raises(CheckpointError) as e:
        muon.try_resume({**state, "optimizer": legacy})
    assert "one AdamW's state" in str(e.value) and "optim=adamw" in str(e.value) and "\n" not in str(e.value)


def test_a_config_saved_before_the_axis_is_the_same_adamw_experiment():
    """config.yaml from before `optim` existed has no optim group: it reads as optim=adamw, so
    re-entering its run with today's defaults is the same experiment, and optim=muon is not."""
    from conftest import compose

    from ablate.run.lifecycle import differences

    stored = OmegaConf.to_container(compose(TINY), resolve=True)
    del stored["optim"]
    assert OptimSpec.from_config(OmegaConf.create(stored)) == OptimSpec()
    assert differences(stored, compose(TINY)) == []
    assert [key for key, _, _ in differences(stored, compose([*TINY, "optim=muon"]))] == ["optim.name"]


def test_the_compiled_step_trains_muon_as_the_eager_one(tmp_path, clean_dynamo):
    from ablate.train.backends import graphs_compiled

    steps = ["train.steps=6", "train.warmup_steps=3", "optim=muon", "model.n_layers=1"]  # less to trace
    plain = scripted_trainer(tmp_path / "plain", *steps)
    assert plain.fit().status == "completed"
    compiled = scripted_trainer(tmp_path / "compiled", *steps, "train.compile_optimizer=true",
                                "train.compile_backend=eager")  # dynamo's graph and guards, no codegen
    graphs, update = [], compiled.apply_update

    def counted():
        update()
        graphs.append(graphs_compiled())

    compiled.apply_update = counted
    out = compiled.fit()
    assert out.status == "completed" and not out.result.compile_fallback
    assert graphs[0] > 0 and graphs[-1] == graphs[0], graphs  # the tensor LR: no recompile per step
    # bf16 Newton-Schulz of a float-rounding-different momentum: close, not equal
    assert loss_curve(compiled) == pytest.approx(loss_curve(plain), rel=1e-3)


def test_diagnostics_rows_carry_each_muon_groups_update_rms(tmp_path):
    trainer = scripted_trainer(tmp_path / "run", "train.steps=4", "train.diagnostics_every=2", "optim=muon",
                               diagnostics=True)
    assert trainer.fit().status == "completed"
    rows = [r for r in trainer.sinks.rows if "diag/loss_spikes" in r]
    assert [r["step"] for r in rows] == [2, 4]
    for row in rows:
        rms = {k: v for k, v in row.items() if k.startswith("diag/update_rms/")}
        assert set(rms) == {"diag/update_rms/muon.input", "diag/update_rms/muon.output"}
        assert all(0.02 < v <= 0.25 for v in rms.values()), rms  # match_rms_adamw aims at 0.2 x lr
        assert any(k.startswith("diag/max_attn_logit/") for k in row)
    plain = scripted_trainer(tmp_path / "plain", "train.steps=2", "train.diagnostics_every=2", diagnostics=True)
    assert plain.fit().status == "completed"
    assert not any(k.startswith("diag/update_rms/") for r in plain.sinks.rows for k in r)


def test_coord_check_stays_flat_with_width_under_mup_and_muon():
    """match_rms_adamw keeps MuAdam's per-group LRs (and Muon's update follows the matrix's
    shape): the hidden sublayers' outputs stay flat with width after the updates."""
    from ablate.measure.coord_check import FLAT, Module, Request, Sweep, measure

    check = measure(Request(Sweep.WIDTH, (64, 128, 256), steps=3, seeds=1, overrides=(
        "model.n_layers=2", "train.batch_size=4", "train.seq_len=32", "train.device=cpu", "param=mup",
        "train.lr=1e-2", "optim=muon")))
    for m in (Module.ATTN_OUT, Module.FFN_OUT, Module.LOGITS):
        assert abs(check.slope(m, 3).mean) <= FLAT, (m, check.slope(m, 3))


def test_a_run_killed_under_muon_resumes_to_the_uninterrupted_runs_losses(tmp_path):
    base = [o for o in TINY if not o.startswith("train.steps")] + [
        "train.steps=60", "train.ckpt_every=10", "train.threads=1", "optim=muon", "act=swiglu"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    res = run_ablate("run", *base, f"hydra.run.dir={ref}")
    assert res.returncode == 0, res.stderr
    args = ("run", *base, f"hydra.run.dir={run}")
    code, _ = stop_after_first_checkpoint(args, signal.SIGKILL, run)
    assert code == -signal.SIGKILL
    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    final = read_summary(run)
    assert final["status"] == "completed" and 0 < final["resumed_from"] < 60
    losses = [[r["train_loss"] for r in read_jsonl(d / "metrics.jsonl") if "train_loss" in r] for d in (ref, run)]
    assert len(losses[0]) == 60 and losses[1] == losses[0]  # every step once, the same numbers
    assert read_summary(ref)["axes"]["optim"] == final["axes"]["optim"] == "muon"
    assert math.isfinite(final["val_loss"]) and final["val_loss"] == read_summary(ref)["val_loss"]


def test_muon_orthogonalizes_each_expert_and_each_of_mlas_matrices_on_its_own():
    """ffn=moe's banks (E, rows, cols): each expert's gate, up and down its own matrix; attn=mla:
    q_a, q_b, proj one matrix each, kv_a two (latent, rope key), kv_b two (W_UK, W_UV); the
    router and MLA's latent norms
    on AdamW. Orthogonalization ignores a matrix's scale, so a gradient G on one matrix and 4 G on
    another give both the same update when each is orthogonalized on its own (bf16 Newton-Schulz:
    to its rounding), and updates far apart when they are orthogonalized as one."""
    cfg = compose([*TINY, "ffn=moe", "ffn.experts=3", "ffn.top_k=1", "act=swiglu", "attn=mla", "pos=rope",
                   "attn.q_rank=16", "attn.kv_rank=16", "attn.rope_dim=4", "bias=off"])
    model = Transformer(ModelSpec.from_config(cfg))
    found = {name: [(m.label, m.shape) for m in ms] for name, _, ms in muon_matrices(model)}
    E, d = 3, 32
    w_in = found["blocks.0.ffn.w_in"]
    h = w_in[0][1][0]  # an expert's hidden width
    assert w_in == [(f"expert {e} rows {a}:{b}", (h, d)) for e in range(E) for a, b in ((0, h), (h, 2 * h))]
    assert found["blocks.0.ffn.w_out"] == [(f"expert {e}", (d, h)) for e in range(E)]
    H, hd = 2, 16
    assert found["blocks.0.attn.kv_b.weight"] == [(f"rows 0:{H * hd}", (H * hd, 16)),
                                                  (f"rows {H * hd}:{2 * H * hd}", (H * hd, 16))]
    assert found["blocks.0.attn.kv_a.weight"] == [("latent", (16, d)), ("rope key", (4, d))]  # declared
    for name in ("q_a", "q_b", "proj"):
        assert len(found[f"blocks.0.attn.{name}.weight"]) == 1, name
    taken = {n for n in found}
    assert not any("router" in n or "norm" in n for n in taken), taken

    train = OmegaConf.merge(TRAIN, {"weight_decay": 0.0})
    opt = build_optimizer(model, train, torch.device("cpu"), OptimSpec(name="muon"))
    ffn, attn = model.blocks[0].ffn, model.blocks[0].attn
    g = torch.randn(h, d, generator=torch.Generator().manual_seed(0))
    ffn.w_in.grad = torch.stack([torch.cat([g, 4 * g]), torch.cat([4 * g, g]), torch.cat([g, g])])
    gk = torch.randn(H * hd, 16, generator=torch.Generator().manual_seed(1))
    attn.kv_b.weight.grad = torch.cat([gk, 4 * gk])
    before_in, before_kv = ffn.w_in.detach().clone(), attn.kv_b.weight.detach().clone()
    opt.step()
    step_in, step_kv = ffn.w_in.detach() - before_in, attn.kv_b.weight.detach() - before_kv
    parts = [step_in[e, a:a + h] for e in range(E) for a in (0, h)]
    tol = 1e-2 * parts[0].abs().max().item()
    assert tol > 0
    for other in parts[1:]:
        torch.testing.assert_close(other, parts[0], rtol=0, atol=tol)
    torch.testing.assert_close(step_kv[H * hd:], step_kv[:H * hd], rtol=0, atol=1e-2 * step_kv.abs().max().item())
