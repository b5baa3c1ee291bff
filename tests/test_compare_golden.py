"""Golden outputs of `ablate compare`: every format on a fixed set of run directories (variants x
seeds with a diverged and a failed run, a study ladder, a mixed pair), frozen in
tests/golden/compare/. The analysis package is refactored under them; a deliberate change of
output regenerates them with `python tests/test_compare_golden.py --write` (then review the diff).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compare_fixtures import make_fixture  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "compare"
ROOT = "<root>"

CASES = {  # name -> (directories under the fixture root, compare arguments)
    "table": (["ab"], []),
    "csv": (["ab"], ["--format", "csv"]),
    "markdown": (["ab"], ["--format", "markdown"]),
    "latex": (["ab"], ["--format", "latex"]),
    "json": (["ab"], ["--json"]),
    "per_seed": (["ab"], ["--per-seed"]),
    "per_seed_csv": (["ab"], ["--per-seed", "--format", "csv"]),
    "per_seed_json": (["ab"], ["--per-seed", "--json"]),
    "where": (["ab"], ["--where", "norm=layernorm,rmsnorm"]),
    "baseline": (["ab"], ["--baseline", "pos=rope"]),
    "baseline_bad": (["ab"], ["--baseline", "no-such-variant"]),
    "train_loss": (["ab"], ["--metric", "train/loss", "--format", "markdown"]),
    "study": (["study"], []),
    "study_csv": (["study"], ["--format", "csv"]),
    "study_json": (["study"], ["--json"]),
    "mixed_refused": (["mixed"], []),
    "mixed_allowed": (["mixed"], ["--allow-mixed", "--format", "markdown"]),
    "two_trees": (["ab", "mixed/a"], ["--allow-mixed"]),
    "lengths": (["lengths"], []),  # the loss at other context lengths: its tables under the main one
    "lengths_csv": (["lengths"], ["--format", "csv"]),
    "lengths_markdown": (["lengths"], ["--format", "markdown"]),
    "lengths_latex": (["lengths"], ["--format", "latex"]),
    "lengths_json": (["lengths"], ["--json"]),
    "lengths_baseline": (["lengths"], ["--baseline", "pos=alibi", "--format", "markdown"]),
}


def run_case(root: Path, name: str) -> str:
    """The command's exit code and output, with the fixture's path replaced by <root>."""
    from typer.testing import CliRunner

    from cli.main import app

    dirs, args = CASES[name]
    res = CliRunner().invoke(app, ["compare", *[str(root / d) for d in dirs], *args],
                             env={"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"})
    return f"exit {res.exit_code}\n" + res.output.replace(str(root), ROOT)


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("golden-compare"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_compare_output_is_unchanged(fixture_root, name):
    expected = (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")
    got = run_case(fixture_root, name)
    if name.endswith("json"):  # the same numbers and keys; key order is not part of the contract
        head, _, body = got.partition("\n")
        ehead, _, ebody = expected.partition("\n")
        assert head == ehead and json.loads(body) == json.loads(ebody)
    else:  # a rich table's widths follow the fixture's path length: compare its cells
        assert squeeze(got) == squeeze(expected)


def squeeze(text: str) -> str:
    return re.sub(r"[ ─━]+", " ", text)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = make_fixture(Path(tmp))
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for case in CASES:
            (GOLDEN / f"{case}.txt").write_text(run_case(root, case), encoding="utf-8")
    print(f"wrote {len(CASES)} golden files to {GOLDEN}")
