"""`ablate coord-check` on the command line: its table and reading, its --json and --plot, and
bad input refused in one line (exit 2) before anything is trained or written."""

from __future__ import annotations

import json

import pytest

from conftest import invoke_ablate

# One layer, 2 x 16 tokens a step: the CLI's plumbing, not the physics (tests/test_coord_check.py).
TINY_CHECK = ["model.n_layers=1", "train.batch_size=2", "train.seq_len=16", "train.device=cpu"]


def invoke(*args: str):
    return invoke_ablate("coord-check", *args)


@pytest.mark.parametrize("args, says", [
    (["--widths", "64,128"], "--widths 64,128: give at least 3 sizes"),
    (["--depths", "2,4"], "--depths 2,4: give at least 3 sizes"),
    (["--widths", "64,0,128"], "every size must be positive, got 0"),
    (["--widths", "-64,64,128"], "every size must be positive, got -64"),
    (["--widths", "64,abc,128"], "--widths takes whole numbers separated by commas"),
    (["--widths", "64,64,128"], "each size once"),
    (["--widths", "64,66,128"], "--widths: 66 is not divisible by model.n_heads=4"),
    (["--widths", "64,128,256", "--depths", "2,4,8"], "--widths and --depths together"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--steps", "many"], "invalid value for '--steps'"),
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["model.d_model=256"], "--widths sets model.d_model; drop the override"),
    (["--plot", "/proc/coord.png"], "--plot /proc/coord.png: cannot write there"),
    (["norm=rmsnrom"], "Could not find 'norm/rmsnrom'"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))  # no corpus tokenized either
    plot = [] if "--plot" in args else ["--plot", str(tmp_path / "coord.png")]
    r = invoke(*args, *plot, *TINY_CHECK)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and r.stdout == "", r.stderr
    assert says in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_folder_as_the_plot_is_refused(tmp_path):
    r = invoke("--plot", str(tmp_path), *TINY_CHECK)
    assert r.returncode == 2 and r.stderr.startswith("error: --plot"), r.stderr


def test_table_names_every_module_and_reads_the_slopes(tmp_path):
    r = invoke("--widths", "32,64,128", "--steps", "2", "--seeds", "1", *TINY_CHECK)
    assert r.returncode == 0, r.stderr
    for label in ("embedding output", "attention logits", "attention output", "FFN output", "residual stream",
                  "output logits"):
        assert label in r.stdout
    assert "t=1" in r.stdout and "t=2" in r.stdout
    assert "sp, width 32-128, step 2: " in r.stdout
    assert "coord-check: width 128, seed 0 ..." in r.stderr  # progress, off stdout


def test_json_and_plot(tmp_path):
    plot = tmp_path / "coord.png"
    r = invoke("--depths", "1,2,3", "--steps", "2", "--seeds", "2", "--json", "--plot", str(plot),
               "model.d_model=32", *TINY_CHECK[1:])  # --depths sets model.n_layers
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["sweep"] == "depth" and record["sizes"] == [1, 2, 3] and record["seeds"] == 2
    assert {v["size"] for v in record["values"]} == {1, 2, 3}
    assert {len(v["layers"]) for v in record["values"] if v["module"] == "residual"} == {1, 2, 3}
    assert len(record["slopes"]) == 7 * 2 and record["reading"].startswith("sp, depth 1-3, step 2: ")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r.stderr == f"plot: {plot}\n"
