"""The W&B key never appears in config.yaml, summary.json, logs, console output or the
W&B run's config. W&B stays offline (WANDB_MODE=offline): nothing here contacts the network."""

from __future__ import annotations

import pytest

from conftest import TINY, run_ablate

KEY = "fakekey0123456789abcdef0123456789abcdef01"  # 40 chars, like a real W&B key


def files_containing(root, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_the_key_from_the_environment_is_written_nowhere(tmp_path):
    tiny = [o for o in TINY if o != "logger=none"] + ["train.threads=1"]
    run = tmp_path / "run"
    res = run_ablate("run", *tiny, "logger=wandb", f"hydra.run.dir={run}",
                     env={"WANDB_API_KEY": KEY, "WANDB_MODE": "offline"})
    assert res.returncode == 0, res.stderr
    assert list(run.glob("wandb/offline-run-*/run-*.wandb")), "the W&B run was recorded"
    assert (run / "config.yaml").is_file() and (run / "summary.json").is_file()
    assert files_containing(run, KEY.encode()) == []
    assert KEY not in res.stdout + res.stderr


@pytest.mark.parametrize("override", [f"logger.api_key={KEY}", f"+logger.api_key={KEY}",
                                      f"+logger.wandb_token={KEY}", f"logger.tags=[{KEY}]"])
def test_a_key_given_as_an_override_is_refused_without_being_echoed(tmp_path, override):
    res = run_ablate("run", *TINY, override, f"out_dir={tmp_path}", env={"WANDB_API_KEY": KEY})
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "WANDB_API_KEY" in lines[0]
    assert KEY not in res.stdout + res.stderr
    assert not any(tmp_path.iterdir())  # nothing written anywhere


def test_a_sweep_refuses_a_key_override_before_writing_anything(tmp_path):
    res = run_ablate("sweep", *TINY, "norm=layernorm,rmsnorm", f"+logger.api_key={KEY}",
                     f"out_dir={tmp_path}")
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1].startswith("error:") and KEY not in res.stdout + res.stderr
    assert not any(tmp_path.iterdir())  # no multirun.yaml, no .hydra/overrides.yaml


@pytest.mark.parametrize("override, env", [
    # a secret-looking variable interpolated: refused by its name, before Hydra sees it
    ("logger.project=${oc.env:WANDB_API_KEY}", {}),
    ("logger.group=${oc.env:HF_TOKEN,none}", {"HF_TOKEN": "hf_" + KEY}),
    # any other variable holding the key: refused once the config is resolved
    ("logger.project=${oc.env:MY_PROJECT}", {"MY_PROJECT": KEY}),
    ("logger.tags=[a,'${oc.env:MY_PROJECT}']", {"MY_PROJECT": KEY}),
])
def test_a_key_reached_through_an_interpolation_is_refused(tmp_path, override, env):
    run = tmp_path / "run"
    res = run_ablate("run", *TINY, override, f"out_dir={tmp_path}", f"hydra.run.dir={run}",
                     env={"WANDB_API_KEY": KEY, **env})
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: 'logger.") and "WANDB_API_KEY" in lines[0]
    assert KEY not in res.stdout + res.stderr
    assert not any(tmp_path.iterdir())  # no run dir, no config.yaml holding the key


def test_an_unset_variable_is_one_line_naming_the_key(tmp_path):
    res = run_ablate("run", *TINY, "out_dir=${oc.env:ABLATE_NOT_SET}", f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: out_dir: cannot resolve its interpolation (Environment variable 'ABLATE_NOT_SET' not "
        "found); set it to a value or define what it refers to"]
    assert not any(tmp_path.iterdir())
