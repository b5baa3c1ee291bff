"""Messages about their own cause, with the command that fixes it: a coord-check example sized
for its flag, the --plot types the help names, a damaged checkpoint that eval and sample cannot
load (no training advice), every conflicting key of a refusal at once."""

from __future__ import annotations


import pytest

from ablate.errors import AblateError, CheckpointError, ConfigError
from ablate.measure.coord_check import parse_sizes
from ablate.run.trained import load_run_model
from ablate.tracking.plots import check_plot_path
from conftest import compose


@pytest.mark.parametrize("flag, text, example", [("--depths", "1,2", "e.g. --depths 2,4,8"),
                                                 ("--depths", "a,b", "e.g. --depths 2,4,8"),
                                                 ("--widths", "64,128", "e.g. --widths 64,128,256")])
def test_coord_checks_example_is_one_for_its_flag(flag, text, example):
    with pytest.raises(ConfigError, match=example):
        parse_sizes(text, flag)


def test_plot_types_are_the_ones_the_help_and_the_error_name(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    for name in ("a.png", "a.pdf", "a.svg", "a.jpg"):
        check_plot_path(tmp_path / name)
    with pytest.raises(AblateError, match=r"use a \.png, \.pdf, \.svg or \.jpg file name"):
        check_plot_path(tmp_path / "a.gif")
    for command in ("compare", "coord-check"):
        help_text = " ".join(CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output.split())
        assert ".jpg" in help_text, command


def test_a_damaged_checkpoint_says_the_weights_are_lost_not_how_to_train(tmp_path):
    from test_sample import write_run

    run = tmp_path / "run"
    write_run(run, [])
    (ckpt,) = run.glob("checkpoints/*")
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    with pytest.raises(CheckpointError) as e:
        load_run_model(run)
    assert str(e.value).startswith(f"{run}: no usable checkpoint (1 found; newest: {ckpt}: ")
    assert "the run's weights cannot be loaded; train the variant again into a new directory" in str(e.value)
    assert "train.resume" not in str(e.value)


def test_a_refusal_names_every_conflicting_key_at_once():
    with pytest.raises(ConfigError) as e:
        compose(["param=mup", "arch=vaswani"])
    assert str(e.value).startswith("model.init=xavier and model.emb_scale=true scale the embeddings")


def test_inspect_counts_the_kv_cache_in_the_runs_precision_as_compare_does():
    from ablate.measure.inspect import inspect_config, run_kv_cache_bytes_per_token

    cpu = compose(["train.device=cpu"])
    assert inspect_config(cpu)["dtype"] == "fp32"
    assert inspect_config(cpu)["kv_cache_bytes_per_token"] == run_kv_cache_bytes_per_token(cpu, "fp32")
    assert inspect_config(compose(["train.precision=bf16"]))["dtype"] == "bf16"
    assert inspect_config(cpu, dtype="bf16")["kv_cache_bytes_per_token"] * 2 == run_kv_cache_bytes_per_token(cpu, "fp32")


def test_coord_checks_reading_says_what_its_settings_cannot_show():
    from ablate.measure.coord_check import CoordCheck, Module, Request, Setting, Sweep, Trace

    def check(param, base, steps):
        sizes = (64, 128, 256)
        traces = [Trace(size, 0, {m: [[size ** (-0.3 if m is Module.LOGITS else 0.0)]] * steps for m in Module})
                  for size in sizes]
        return CoordCheck(Request(Sweep.WIDTH, sizes, steps, 1), Setting(param, base, 3e-3, 4, 64, "cpu", "fp32"),
                          traces).reading()

    two = check("mup", 64, 2)
    assert "output logits shrink with width" in two
    assert two.endswith("(under mup the steps right after init are a transient of the init, which shrinks the logits "
                        "by design: judge from --steps 4 or more (docs/parametrization.md))")
    assert "transient" not in check("mup", 64, 4) and "transient" not in check("sp", None, 2)
    assert "(model.base_width=512 is outside the widths 64-256: no model here is at its base shape)" in \
        check("mup", 512, 4)


def test_a_ladder_with_one_lr_and_one_seed_says_so_and_names_no_interval(tmp_path):
    from ablate.analysis.report import CompareOptions, build_report
    from compare_fixtures import write_ladder_sweep

    one = build_report([write_ladder_sweep(tmp_path / "one", seeds=1)], CompareOptions())
    notes = " ".join(one.notes)
    assert "no LR grid: every variant ran at the same learning rate on a rung" in notes and "--lr-grid" in notes
    assert "no CIs: one seed a rung (--seeds 2 or more for intervals)" in notes and "t-interval" not in notes
    two = " ".join(build_report([write_ladder_sweep(tmp_path / "two", seeds=2)], CompareOptions()).notes)
    assert "CIs: each rung's Δ t-interval" in two


def test_help_text_is_broken_by_the_terminal_not_by_the_docstring():
    from typer.testing import CliRunner

    from cli.main import app

    wide = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "120"}).output
    assert "runs that differ in anything else (steps, data, size, lr ...) are" in wide  # one line, not two
    run = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "120"}).output
    assert "\n act: " in run and "\n norm: " in run  # a \b list keeps its lines
