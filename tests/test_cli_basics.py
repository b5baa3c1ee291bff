"""CLI basics: --version, `ablate run --help` lists the config groups (no torch import),
`--hydra-help` advertises no shell completion, `--cfg` refuses a config a run would refuse."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, run_ablate

from ablate import __version__
from ablate.config.axes import CONF_DIR
from ablate.config.schema import AXES
from ablate.model.options import names


def test_version():
    res = run_ablate("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"ablate {__version__}"


def test_run_help_lists_every_config_group_and_its_options_without_importing_torch():
    code = ("import sys; from typer.testing import CliRunner; from cli.main import app; "
            "r = CliRunner().invoke(app, ['run', '--help'], terminal_width=200); "
            "print(r.output); assert 'torch' not in sys.modules, 'torch imported'")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [line.strip() for line in res.stdout.splitlines()]
    for group in ("norm", "act", "pos", "attn", "model", "data", "tokenizer", "logger", "launcher", "arch"):
        # an axis's options are its declarations (ablate/model/options.py), the others conf files
        options = sorted(names(group)) if group in AXES else sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        assert f"{group}: {', '.join(options)}" in lines


def test_hydra_help_advertises_no_shell_completion():
    res = run_ablate("run", "--hydra-help")
    assert res.returncode == 0 and "--cfg" in res.stdout
    assert "-sc" not in res.stdout and "install=bash" not in res.stdout


def test_cfg_refuses_an_invalid_config_like_a_run(tmp_path):
    res = run_ablate("run", "train.schedule=cosin", f"out_dir={tmp_path / 'runs'}", "--cfg", "job")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "error: train.schedule must be cosine, linear or constant, got 'cosin'"]
    assert not (tmp_path / "runs").exists()
    ok = run_ablate("run", "train.schedule=linear", "--cfg", "job", "--package", "train")
    assert ok.returncode == 0 and "schedule: linear" in ok.stdout
