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
