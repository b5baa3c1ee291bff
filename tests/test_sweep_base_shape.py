"""A sweep that varies the width under param=mup or completep names model.base_width (and one that
varies completep's depth, model.base_depth): left null, each run's base would be its own shape, so
every run would train as sp. Refused in one line, exit 2, before anything is launched."""

from __future__ import annotations

import json

import pytest

from conftest import run_ablate


@pytest.mark.parametrize("args, message", [
    (["model.d_model=32,64", "param=mup"],
     "param=mup with model.base_width=null takes each run's own model.d_model as its base, so the runs at "
     "model.d_model=32, 64 would each train as sp: name the base for all of them, e.g. model.base_width=32"),
    (["param=sp,mup", "model.d_model=32,64", "--mode", "grid"], "model.base_width=32"),
    (["model.n_layers=2,4", "param=completep"], "param=completep with model.base_depth=null takes each run's "
     "own model.n_layers as its base, so the runs at model.n_layers=2, 4 would each lose the depth rules"),
])
def test_a_width_or_depth_sweep_without_its_base_is_refused(args, message, tmp_path):
    for dry in ([], ["--dry-run"]):
        res = run_ablate("sweep", *args, *dry, "logger=none", f"out_dir={tmp_path}")  # nothing trains
        assert res.returncode == 2, res.stdout + res.stderr
        assert message in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args", [
    ["model.d_model=32,64", "param=mup", "model.base_width=32"],
    ["model.d_model=32,64", "param=sp"],  # no base shape to resolve
    ["model.n_layers=2,4", "param=mup"],  # mup has no depth rules
    ["model.d_model=32,64", "param=sp,mup"],  # ofat: the mup run is at the baseline's width only
])
def test_a_sweep_that_names_its_base_or_needs_none_plans(args, tmp_path):
    res = run_ablate("sweep", *args, f"out_dir={tmp_path}", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) >= 2
