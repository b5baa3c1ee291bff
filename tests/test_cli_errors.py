"""A new user's first-hour mistakes, each refused in one line that says what to do (exit 2, no
traceback, nothing written): a run directory pasted from a banner, a directory that cannot be
made, flags written for overrides, `--seeds 0`; every error line begins `error: `; and
`make clean` leaves the user's runs alone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, TINY, find_run_dirs, invoke_ablate, run_ablate


def one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_a_run_dir_pasted_from_the_banner_says_how_to_quote_it_and_to_resume(tmp_path):
    r = run_ablate("run", *TINY, "train.steps=1", "norm=rmsnorm", f"out_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    (run_dir,) = find_run_dirs(tmp_path)
    assert "=" in run_dir.name  # the name holds its overrides, as the banner shows it
    line = one_line(run_ablate("run", *TINY, f"hydra.run.dir={run_dir}"))
    assert f"`ablate resume {run_dir}`" in line
    quoted = line.split("write ", 1)[1].split(" (the outer", 1)[0]
    assert quoted == f"'hydra.run.dir=\"{run_dir}\"'"
    # the quoted form is one the shell hands over as hydra.run.dir="DIR": Hydra reads it
    res = run_ablate("run", *TINY, quoted[1:-1], "--cfg", "hydra", "--package", "hydra.run")
    assert res.returncode == 0 and str(run_dir) in res.stdout, res.stderr
    line = one_line(run_ablate("sweep", *TINY, f"hydra.sweep.dir={tmp_path}/s_x=1", "norm=layernorm,rmsnorm"))
    assert f"`ablate resume {tmp_path}/s_x=1`" in line and not (tmp_path / "s_x=1").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("command, override, what", [
    ("run", "hydra.run.dir=/proc/ablate-x", "run directory /proc/ablate-x"),
    ("run", "out_dir=/proc/ablate-x", "out_dir /proc/ablate-x"),
    ("sweep", "hydra.sweep.dir=/proc/ablate-x", "sweep directory /proc/ablate-x"),
])
def test_a_directory_that_cannot_be_made_is_one_line(command, override, what):
    swept = ["norm=layernorm,rmsnorm"] if command == "sweep" else []
    line = one_line(run_ablate(command, *TINY, override, *swept))
    assert line.startswith(f"error: {what} cannot be created"), line


@pytest.mark.parametrize("args", [["--seeds", "0"], ["--seeds", "-1"], ["hydra.sweeper.seeds=-2"]])
def test_seeds_below_one_are_refused(args, tmp_path):
    line = one_line(run_ablate("sweep", *TINY, *args, "norm=layernorm,rmsnorm", f"out_dir={tmp_path}"))
    assert "--seeds must be >= 1" in line and not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_an_override_written_as_an_option_gets_our_hint(command, tmp_path):
    res = invoke_ablate(command, *TINY, "--norm=rmsnorm", f"out_dir={tmp_path}")  # refused before Hydra
    line = one_line(res)
    assert "unknown option '--norm=rmsnorm'" in line and "`norm=rmsnorm`" in line
    assert "usage" not in res.stderr.lower() and "--shell-completion" not in res.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args", [
    ["export"],  # a missing argument (click)
    ["compare", "--bogus"],  # an unknown option (click)
    ["no-such-command"],
    ["sweep", "--seeds", "x"],  # a value of the wrong type (click)
    ["sweep", "--mode", "random", "norm=layernorm,rmsnorm"],  # ours
    ["run", "norm=bogus"],  # Hydra's, as ours
])
def test_every_error_line_begins_the_same_way(args):
    res = invoke_ablate(*args)  # through the CLI's own entry point, which words click's errors
    one_line(res)
    assert "Error" not in res.stderr and "Usage" not in res.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_keeps_the_users_runs(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    summary = tmp_path / "runs" / "2026-11-23" / "12-00-00_norm=rmsnorm" / "summary.json"
    sweep = tmp_path / "runs" / "sweeps" / "2026-11-23_12-00-00" / "sweep.json"
    for f in (summary, sweep, tmp_path / ".venv" / "bin" / "python", tmp_path / ".pytest_cache" / "x"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
    res = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert summary.is_file() and sweep.is_file()
    assert not (tmp_path / ".venv").exists() and not (tmp_path / ".pytest_cache").exists()
