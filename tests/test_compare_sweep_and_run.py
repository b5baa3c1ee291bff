"""A sweep and a single run in one comparison: keys that change nothing trained (the evaluation
cadence, kernels chosen for determinism) do not make them incomparable, keys that change what is
trained or measured still do, and a single run is named only by the settings that differ."""

from __future__ import annotations

import json

import pytest

from ablate.analysis import CompareError, compare_dirs
from ablate.names import variant_name
from conftest import TINY, invoke_ablate, run_ablate
from compare_fixtures import BASE, NOISY, PAIRED, by_name, set_config, write_run

SHARED = ["model.d_model=32", "train.steps=100"]  # given to the sweep and to the run alike


def write_sweep(root, **train):
    """`ablate sweep act=gelu,swiglu --seeds 3 train.steps=100` with `train` settings on top."""
    jobs = (("baseline", "gelu", {}, BASE), ("act=swiglu", "swiglu", {"act": "swiglu"}, PAIRED))
    for i, (variant, act, change, values) in enumerate(jobs):
        for s, v in values.items():
            d = write_run(root, f"{3 * i + s}_{variant}_seed{s}", change, s, v, sweep=root.name,
                          variant=variant)
            _settle(d, sorted([f"act={act}", *SHARED, *(f"train.{k}={v}" for k, v in train.items())]),
                    steps=100, **train)


def write_single(root, overrides: list[str], **train):
    """`ablate run act=relu train.steps=100 seed=S` for three seeds (train settings on top)."""
    for s, v in NOISY.items():
        d = write_run(root, f"relu_s{s}", {"act": "relu"}, s, v)
        _settle(d, sorted(overrides), **{"steps": 100, **train})


def _settle(run_dir, overrides: list[str], **train) -> None:
    """Set train.* in the run's config.yaml, and its summary's overrides (and a single run's
    variant name) as `ablate` records them."""
    for k, v in train.items():
        set_config(run_dir, f"train.{k}", v)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["overrides"] = overrides
    if not summary["sweep"]:
        summary["variant"] = variant_name(overrides)
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_a_sweep_and_a_run_that_differ_only_in_eval_cadence_compare(tmp_path):
    write_sweep(tmp_path / "sweep", eval_every=50, deterministic=True)
    write_single(tmp_path / "run", ["act=relu", *SHARED], eval_every=200)
    rows = compare_dirs([tmp_path / "sweep", tmp_path / "run"])
    assert [r["variant"] for r in rows] == ["baseline", "act=swiglu", "act=relu"]
    assert rows.mixed == {} and all(r["mixed"] == [] for r in rows)
    relu = by_name(rows)["act=relu"]
    assert relu["n"] == 3 and relu["test"] == "paired t"


def test_a_run_recorded_with_its_eval_cadence_as_an_override_is_named_without_it(tmp_path):
    """Runs made before train.eval_every stopped naming a variant list it among their overrides."""
    write_sweep(tmp_path / "sweep", eval_every=50)
    write_single(tmp_path / "run", ["act=relu", *SHARED, "train.eval_every=0"], eval_every=0)
    rows = compare_dirs([tmp_path / "sweep", tmp_path / "run"])
    assert [r["variant"] for r in rows] == ["baseline", "act=swiglu", "act=relu"]


def test_keys_that_change_what_is_trained_or_measured_still_refuse(tmp_path):
    """train.eval_tokens: val_loss is measured on another number of tokens."""
    write_sweep(tmp_path / "sweep", eval_tokens=512)
    write_single(tmp_path / "run", ["act=relu", *SHARED, "train.eval_tokens=1024"], eval_tokens=1024)
    with pytest.raises(CompareError, match=r"train\.eval_tokens \(512 in 6 runs, 1024 in 3 runs\)"):
        compare_dirs([tmp_path / "sweep", tmp_path / "run"])


def test_with_allow_mixed_the_run_is_named_by_what_differs_only(tmp_path):
    write_sweep(tmp_path / "sweep")
    write_single(tmp_path / "run", ["act=relu", "model.d_model=32", "train.steps=300"], steps=300)
    rows = compare_dirs([tmp_path / "sweep", tmp_path / "run"], allow_mixed=True)
    assert [r["variant"] for r in rows] == ["baseline", "act=swiglu", "act=relu,train.steps=300"]
    assert rows.mixed == {"train.steps": {"100": 6, "300": 3}}


def test_single_runs_keep_their_names_and_share_nothing_in_them(tmp_path):
    """Single runs alone: a lone variant keeps its full name; among several, what they share goes."""
    for s, v in PAIRED.items():
        _settle(write_run(tmp_path / "a", f"rms_s{s}", {"norm": "rmsnorm"}, s, v),
                ["model.d_model=32", "norm=rmsnorm", "train.steps=100"], steps=100)
    assert [r["variant"] for r in compare_dirs([tmp_path / "a"])] == [
        "model.d_model=32,norm=rmsnorm,train.steps=100"]  # one variant: named as its runs are
    for s, v in BASE.items():
        _settle(write_run(tmp_path / "b", f"base_s{s}", {}, s, v), ["model.d_model=32", "train.steps=100"],
                steps=100)
    rows = compare_dirs([tmp_path / "a", tmp_path / "b"])
    assert [r["variant"] for r in rows] == ["baseline", "norm=rmsnorm"]


@pytest.mark.slow
def test_a_real_sweep_and_a_real_run_with_another_eval_cadence(tmp_path):
    """Real runs: evaluating every 3 steps or only at the end trains the same weights (the final
    losses are equal to the last bit), and compare takes the sweep and a run made apart from it."""
    tiny = [o for o in TINY if not o.startswith("train.eval_every")] + ["train.threads=1"]
    jobs = [("sweep", "act=gelu,swiglu", *tiny, "train.eval_every=3", f"hydra.sweep.dir={tmp_path}/sweep"),
            ("run", "act=relu", *tiny, "train.eval_every=0", f"hydra.run.dir={tmp_path}/relu"),
            ("run", "act=swiglu", *tiny, "train.eval_every=0", f"hydra.run.dir={tmp_path}/swiglu")]
    for job in jobs:
        res = run_ablate(*job)
        assert res.returncode == 0, res.stderr
    swept = json.loads(next((tmp_path / "sweep").glob("*act=swiglu*/summary.json")).read_text())
    alone = json.loads((tmp_path / "swiglu" / "summary.json").read_text())
    assert (alone["val_loss"], alone["train_loss"]) == (swept["val_loss"], swept["train_loss"])
    res = invoke_ablate("compare", str(tmp_path / "sweep"), str(tmp_path / "relu"), "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["variant"] for r in rows] == ["baseline", "act=swiglu", "act=relu"]
    assert rows[0]["mixed"] == []
