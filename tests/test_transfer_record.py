"""transfer.json, an --lr-grid or --ladder sweep's record (ablate/sweep/transfer_record.py): the
files the sweep wrote before the record was typed (tests/golden/transfer/, from acda4bf) load, say
what the sweep ran, and are written back byte for byte; the plan writes the same record from the
same command; a file that is not a record is one line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ablate.sweep.transfer_record import (LrRule, TransferKind, TransferRecord, TransferRecordError,
                                          read_transfer)
from conftest import ROOT, invoke_ablate

GOLDEN = ROOT / "tests" / "golden" / "transfer"
GOLDEN_PARAMS = {"r0": 25472, "r1": 84912, "r2": 200064}  # the baseline's non-embedding params per rung


def golden(name: str, tmp_path: Path) -> Path:
    sweep = tmp_path / name
    sweep.mkdir()
    shutil.copy(GOLDEN / f"{name}.json", sweep / "transfer.json")
    return sweep


@pytest.mark.parametrize("name", ["grid", "ladder", "ladder_grid", "ladder_mup"])
def test_a_record_written_before_it_was_typed_loads_and_is_written_back_unchanged(name, tmp_path):
    sweep = golden(name, tmp_path)
    before = (sweep / "transfer.json").read_text()
    record = read_transfer(sweep)
    record.write(sweep)
    assert (sweep / "transfer.json").read_text() == before
    assert TransferRecord.from_json(json.loads(before)) == record


def test_the_old_records_read_as_what_their_sweeps_ran(tmp_path):
    grid = read_transfer(golden("grid", tmp_path))
    assert (grid.kind, grid.grid, grid.seeds, grid.shared_lr, grid.ladder) == (
        TransferKind.LR_GRID, (0.001, 0.01, 0.1), 2, 0.003, None)
    ladder = read_transfer(golden("ladder", tmp_path))
    assert ladder.kind is TransferKind.LADDER and ladder.grid == () and ladder.seeds == 0
    assert ladder.ladder.lr_rule is LrRule.WIDTH and ladder.ladder.steps == 2 and ladder.ladder.base_depth is None
    assert ladder.ladder.tokens_per_param is None and ladder.ladder.base == (128, 2)
    assert [(r.name, r.params, r.steps, r.tokens, r.lr) for r in ladder.rungs] == [
        ("r0", 25472, 2, 256, 0.012), ("r1", 84912, 2, 256, 0.008), ("r2", 200064, 2, 256, 0.006)]
    assert [ladder.ladder.lr(r) for r in ladder.ladder.rungs] == [r.lr for r in ladder.rungs]  # the width rule
    mup = read_transfer(golden("ladder_mup", tmp_path))
    assert mup.one_scan and not ladder.one_scan and mup.ladder.base == (32, 2) and mup.ladder.tokens_per_param == 1.0
    assert [r.steps for r in mup.rungs] == [199, 664, 1563] and mup.ladder.steps is None


@pytest.mark.parametrize("name, args, lr_grid, seeds", [
    ("grid", ["act=gelu,swiglu"], "1e-3:1e-1:3", 2),
    ("ladder", ["act=gelu,swiglu", "ladder.steps=2"], None, 0),
    ("ladder_grid", ["act=gelu,swiglu", "ladder.steps=2"], "1e-3:1e-1:3", 2),
    ("ladder_mup", ["act=gelu,swiglu", "param=mup", "ladder.lr_rule=mup", "ladder.base_width=32",
                    "ladder.base_depth=2", "ladder.tokens_per_param=1,2"], "1e-3:1e-1:3", 2),
])
def test_the_plan_writes_what_the_sweep_wrote_before(name, args, lr_grid, seeds, tmp_path):
    """The same command (tests/golden/transfer/README.md), with the baseline's params per rung and
    32 x 4 tokens a step as the sweeper composed them, gives the frozen file byte for byte."""
    from ablate.sweep.transfer_plan import TransferPlan

    plan = TransferPlan.make(args, "ofat", seeds, None, lr_grid, None if name == "grid" else "cpu",
                             lambda job, rung: (GOLDEN_PARAMS[rung.name], 128), lambda job: 0.003,
                             lambda job: "mup" if "param=mup" in args else "sp")
    plan.record_in(tmp_path)
    assert (tmp_path / "transfer.json").read_text() == (GOLDEN / f"{name}.json").read_text()
    plan.record_in(tmp_path)  # a re-run of the same sweep: the same record, accepted


@pytest.mark.parametrize("text, why", [
    ("{not json", "Expecting property name"),
    ('["lr_grid"]', "expected an object, got list"),
    ('{"kind": "grid", "seeds": 1}', "'grid' is not a valid TransferKind"),
    ('{"kind": "ladder", "seeds": 1, "rungs": []}', "no key 'ladder'"),
])
def test_a_file_that_is_not_a_record_is_one_line_naming_it(text, why, tmp_path):
    from compare_fixtures import write_grid_sweep

    sweep = write_grid_sweep(tmp_path)
    (sweep / "transfer.json").write_text(text)
    with pytest.raises(TransferRecordError, match="is not an --lr-grid or --ladder sweep's record"):
        read_transfer(sweep)
    res = invoke_ablate("compare", str(sweep))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"error: {sweep / 'transfer.json'} is not an --lr-grid") and why in res.stderr
