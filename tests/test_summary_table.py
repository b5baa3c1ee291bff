"""The summary table a run prints at its end: figures that say when they were measured."""

from __future__ import annotations

import shutil
from pathlib import Path

from ablate.names import Status
from ablate.run.record import read_record
from ablate.run.summary import summary_table
from ablate.terminal import render

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "collapse"  # tests/test_collapse.py writes why


def test_a_run_stopped_between_evaluations_says_when_its_val_loss_was_measured(tmp_path):
    """An interrupted run: 58 of 150 steps, its last evaluation the one at step 0."""
    import json

    run = Path(shutil.copytree(FIXTURES / "layernorm", tmp_path / "run"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["step"] <= 58 and (r["step"] == 0 or "val_loss" not in r)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    record = read_record(run)
    record.status, record.step, record.result.val_loss = Status.INTERRUPTED, 58, kept[0]["val_loss"]
    text = " ".join(render(summary_table(record, run)).split())
    assert f"val_loss │ {kept[0]['val_loss']:.4f} (at step 0)" in text and "steps │ 58/150" in text
    assert "(at step" not in " ".join(render(summary_table(read_record(FIXTURES / "layernorm"), FIXTURES / "layernorm")).split())
