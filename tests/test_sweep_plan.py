"""Which jobs `ablate sweep` runs (one factor at a time, grid, seeds, a study), listed
by the real CLI through Hydra and the sweeper plugin with --dry-run --json; bad input refused
before anything is launched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import ROOT, run_ablate

MIXED = ["norm=layernorm,rmsnorm", "act=gelu,swiglu,relu", "train.lr=0.003,0.001"]


def dry_run(*args, tmp_path):
    res = run_ablate("sweep", *args, f"out_dir={tmp_path}", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    return [job for job in json.loads(res.stdout)]


def as_dict(job):
    return dict(o.split("=", 1) for o in job)


def test_ofat_is_the_baseline_plus_one_change_per_job(tmp_path):
    jobs = [as_dict(j) for j in dry_run(*MIXED, "model=tiny", tmp_path=tmp_path)]
    base = {"norm": "layernorm", "act": "gelu", "train.lr": "0.003", "model": "tiny"}
    expected = [base,
                {**base, "norm": "rmsnorm"},
                {**base, "act": "swiglu"}, {**base, "act": "relu"},
                {**base, "train.lr": "0.001"}]
    assert [{k: v for k, v in j.items() if k != "out_dir"} for j in jobs] == expected
    assert not list(tmp_path.iterdir())  # a dry run makes no directory


def test_seeds_multiply_every_variant_with_paired_data(tmp_path):
    one = dry_run(*MIXED, tmp_path=tmp_path)
    two = dry_run(*MIXED, "--seeds", "2", tmp_path=tmp_path)
    assert len(two) == 2 * len(one)
    for i, job in enumerate(one):
        for seed in (0, 1):
            with_seed = as_dict(two[2 * i + seed])
            assert with_seed.pop("seed") == str(seed)
            assert with_seed == as_dict(job)  # same overrides otherwise: data_seed untouched


def test_grid_is_the_cartesian_product(tmp_path):
    jobs = [as_dict(j) for j in dry_run(*MIXED, "--mode", "grid", tmp_path=tmp_path)]
    combos = {(j["norm"], j["act"], j["train.lr"]) for j in jobs}
    assert len(jobs) == len(combos) == 2 * 3 * 2
    assert len(dry_run(*MIXED, "--mode", "grid", "--seeds", "3", tmp_path=tmp_path)) == 36


def test_study_gpt2_to_llama_is_the_cumulative_ladder(tmp_path):
    res = run_ablate("sweep", "study=gpt2_to_llama", f"out_dir={tmp_path}", "--dry-run")
    assert res.returncode == 0, res.stderr
    names = [line.split()[1] for line in res.stdout.splitlines() if line.strip().startswith("#")]
    assert names == ["gpt2", "+rmsnorm", "+swiglu", "+rope", "+bias_off", "+gqa", "+untied"]
    jobs = [set(j) - {"study=gpt2_to_llama", f"out_dir={tmp_path}"}
            for j in dry_run("study=gpt2_to_llama", tmp_path=tmp_path)]
    ladder = ["norm=rmsnorm", "act=swiglu", "pos=rope", "bias=off", "attn=gqa", "tie=untied"]
    assert jobs == [set(ladder[:i]) for i in range(len(ladder) + 1)]


def test_sweep_names_job_dirs_by_their_change_and_seed():
    from ablate.sweep import plan

    jobs = plan(["norm=layernorm,rmsnorm", "train.steps=5"], seeds=2)
    assert [j.name for j in jobs] == ["baseline_seed0", "baseline_seed1",
                                      "norm=rmsnorm_seed0", "norm=rmsnorm_seed1"]


def test_ofat_sweep_with_no_swept_axis_is_refused(tmp_path):
    res = run_ablate("sweep", "norm=rmsnorm", "train.steps=5", "logger=none", f"out_dir={tmp_path}")
    assert res.returncode != 0
    assert res.stderr.startswith("error: an ofat sweep needs") and "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())


def test_unknown_option_in_a_sweep_is_refused_before_launch(tmp_path):
    res = run_ablate("sweep", "norm=layernorm,rmsnrm", "logger=none", f"out_dir={tmp_path}")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "rmsnrm" in res.stderr and "rmsnorm" in res.stderr and not list(tmp_path.iterdir())


def test_a_launcher_that_is_not_installed_is_named_before_launch(tmp_path):
    # Shadow hydra-submitit-launcher with a broken copy: Hydra's plugin scan skips it, as if
    # the package were not installed.
    fake = tmp_path / "shadow" / "hydra_plugins" / "hydra_submitit_launcher"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    res = run_ablate("sweep", "launcher=slurm", "norm=layernorm,rmsnorm", f"out_dir={tmp_path / 'runs'}",
                     env={"PYTHONPATH": f"{fake.parent.parent}:{ROOT}", "PYTHONWARNINGS": "ignore"})
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: launcher=slurm needs") and "pip install hydra-submitit-launcher" in last
    assert not (tmp_path / "runs").exists()


def test_bad_mode_and_json_without_dry_run(tmp_path):
    res = run_ablate("sweep", "norm=layernorm,rmsnorm", "--mode", "random", "logger=none", f"out_dir={tmp_path}")
    assert res.returncode != 0 and "error: unknown --mode 'random'" in res.stderr
    res = run_ablate("sweep", "norm=layernorm,rmsnorm", "--json", "logger=none", f"out_dir={tmp_path}")
    assert res.returncode != 0 and "--dry-run" in res.stderr and not list(tmp_path.iterdir())


def test_plugin_is_discovered_from_the_installed_package(tmp_path):
    """The Makefile's `pip install -e ".[test]"` (hatchling): Hydra finds the sweeper from any
    working directory, not only from the repo root."""
    code = textwrap.dedent("""
        from hydra.core.plugins import Plugins
        from hydra.plugins.sweeper import Sweeper
        print([p.__name__ for p in Plugins.instance().discover(Sweeper)])
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "AblateSweeper" in out.stdout


def test_hydra_flags_pass_through_sweep(tmp_path):
    res = run_ablate("sweep", "--info", "plugins")
    assert res.returncode == 0 and "AblateSweeper" in res.stdout
    res = run_ablate("sweep", "norm=rmsnorm", "--cfg", "job", f"out_dir={tmp_path}")
    assert res.returncode == 0 and "name: rmsnorm" in res.stdout and not list(tmp_path.iterdir())


def test_a_swept_seed_multiplies_like_seeds_and_conflicts_are_refused():
    import pytest

    from ablate.errors import ConfigError
    from ablate.sweep import plan

    assert [j.overrides for j in plan(["seed=0,1", "act=gelu,relu"])] == \
        [j.overrides for j in plan(["act=gelu,relu"], seeds=2)]
    with pytest.raises(ConfigError, match="not both"):
        plan(["seed=5", "act=gelu,relu"], seeds=2)
    with pytest.raises(ConfigError, match="'norm' is given twice"):
        plan(["norm=rmsnorm", "norm=layernorm,rmsnorm"])
    with pytest.raises(ConfigError, match="two or more values"):
        plan(["norm=rmsnorm,rmsnorm"])


def test_ofat_preset_job_takes_the_axes_the_preset_sets(tmp_path):
    """A group on the command line beats a preset's `override /norm`, so the arch=llama job must
    not hold the baseline's norm=layernorm: it would be Llama with LayerNorm, named Llama."""
    jobs = [as_dict(j) for j in dry_run("arch=gpt2,llama", "norm=layernorm,rmsnorm",
                                        "train.lr=0.003,0.001", tmp_path=tmp_path)]
    for j in jobs:
        j.pop("out_dir")
    assert jobs == [{"arch": "gpt2", "norm": "layernorm", "train.lr": "0.003"},
                    {"arch": "llama", "train.lr": "0.003"},  # norm from the preset; lr held
                    {"arch": "gpt2", "norm": "rmsnorm", "train.lr": "0.003"},
                    {"arch": "gpt2", "norm": "layernorm", "train.lr": "0.001"}]
    from conftest import compose

    assert compose(["arch=llama", "train.lr=0.003"]).norm.name == "rmsnorm"  # really Llama
    res = run_ablate("sweep", "arch=gpt2,llama", "norm=layernorm,rmsnorm", f"out_dir={tmp_path}",
                     "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "takes norm from arch=llama, not the baseline's norm=layernorm" in res.stdout


def test_ofat_preset_keeps_fixed_keys_and_its_plain_values():
    from ablate.sweep import plan

    jobs = plan(["arch=gpt2,vaswani", "act=gelu,silu", "model.emb_scale=false,true", "norm=rmsnorm"])
    by_name = {j.name: j.overrides for j in jobs}
    # the user fixed norm=rmsnorm for every job; vaswani sets act and model.emb_scale itself
    assert by_name["arch=vaswani"] == ["norm=rmsnorm", "arch=vaswani"]
    assert by_name["act=silu"] == ["norm=rmsnorm", "arch=gpt2", "model.emb_scale=False", "act=silu"]
    # a non-preset change still holds every other swept key at its baseline value
    assert by_name["model.emb_scale=True"] == ["norm=rmsnorm", "arch=gpt2", "act=gelu",
                                               "model.emb_scale=True"]
    seeded = plan(["arch=gpt2,llama", "norm=layernorm,rmsnorm"], seeds=2)
    assert [j.overrides for j in seeded if j.variant == "arch=llama"] == [["arch=llama", "seed=0"],
                                                                          ["arch=llama", "seed=1"]]


def test_a_dry_run_checks_every_job_as_the_sweep_does(tmp_path):
    """A dry run exists to catch a bad job before launching; it refuses what the real
    sweep refuses, in the same one line (the first job composes, so only the sweeper sees #1)."""
    for dry in (["--dry-run"], []):
        res = run_ablate("sweep", "norm=layernorm,rmsnrom", f"out_dir={tmp_path}", *dry)
        assert res.returncode == 2, res.stdout
        assert res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr
        assert res.stderr.startswith("error: job #1 (norm=rmsnrom): ") and "rmsnorm" in res.stderr
        assert "#0" not in res.stdout and not list(tmp_path.iterdir())
