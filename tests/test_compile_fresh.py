"""Every model compiles afresh. Dynamo caches compiled code per code object
(Transformer.forward is one object for every variant) up to its recompile limit (8); past it,
later models of the same process (in-process sweep jobs, `bench --axes` variants) silently ran
eagerly. The `eager` backend exercises dynamo's guards and limit in seconds."""

from __future__ import annotations

import torch

from conftest import scripted_trainer

# Ten variants that each change what dynamo guards on (module classes, attributes, buffers).
VARIANTS = ["norm=rmsnorm", "act=swiglu", "act=relu", "pos=rope", "pos=alibi", "pos=nope",
            "tie=untied", "bias=off", "qk_norm=on", "norm_pos=sandwich"]
COMPILED = ["train.steps=2", "train.compile=true", "train.compile_backend=eager", "model.n_layers=1"]


def fit_each(tmp_path, variants):
    outcomes = {}
    for v in variants:
        trainer = scripted_trainer(tmp_path / v, v, *COMPILED)
        outcomes[v] = trainer.fit()
        assert outcomes[v].status == "completed" and trainer.compiled
    return outcomes


def test_ten_compiled_variants_in_one_process_none_falls_back(tmp_path, clean_dynamo, capsys):
    outcomes = fit_each(tmp_path, VARIANTS)
    fell = {v: o.result.compile_fallback_reason for v, o in outcomes.items() if o.result.compile_fallback}
    assert fell == {}
    assert "fell back to eager" not in capsys.readouterr().err


def test_without_the_reset_a_later_model_falls_back_and_the_run_says_so(tmp_path, clean_dynamo,
                                                                       monkeypatch, capsys):
    """The same loop without the reset (and a limit of 3 instead of 8, to be quick): the run
    that meets the limit and every later one record the fallback and print one line each."""
    monkeypatch.setattr("ablate.train.backends.reset_compile_state", lambda: None)
    with torch._dynamo.config.patch(recompile_limit=3):  # monkeypatch's undo breaks dynamo's config
        outcomes = fit_each(tmp_path, VARIANTS[:5])
    flags = [o.result.compile_fallback for o in outcomes.values()]
    assert flags[:2] == [False, False] and flags[-1] is True, flags
    first = next(o for o in outcomes.values() if o.result.compile_fallback)
    assert "recompile_limit" in first.result.compile_fallback_reason
    err = capsys.readouterr().err
    assert err.count("warning: torch.compile fell back to eager") == sum(flags)


def test_compile_backend_is_checked_at_compose_time():
    from conftest import run_ablate, TINY

    res = run_ablate("run", *TINY, "train.compile_backend=nope")
    assert res.returncode == 2 and "error: train.compile_backend must be inductor" in res.stderr
    assert "Traceback" not in res.stderr
