"""What a sweep prints when it ends is what `ablate compare` prints of its directory: the loss
at other context lengths (train.eval_lengths) under the main table, without a second command."""

from __future__ import annotations

from pathlib import Path

from ablate.names import Status
from ablate.sweep.planning import Job
from ablate.sweep.progress import JobResult, finish
from compare_fixtures import write_length_runs
from conftest import run_ablate


def test_the_sweeps_closing_comparison_includes_the_length_table(tmp_path, capsys):
    root = write_length_runs(tmp_path / "sweep")
    results = [JobResult(Job([], d.name), Status.COMPLETED, str(d)) for d in sorted(root.iterdir())]
    assert finish(results, root) == 0
    out = capsys.readouterr().out
    compare = run_ablate("compare", str(root))
    assert compare.returncode == 0, compare.stderr
    assert "ablate compare: loss by evaluation length" in out
    assert out.split("sweep: 9/9 jobs finished")[0] == compare.stdout  # the same tables, notes and all
    assert Path(root / "sweep.json").is_file()
