"""The loss at other lengths as a terminal of 80, 100 and 120 columns and a pipe show it: eval's
per-run tables broken at spaces (never inside a word: "sc/ored"), a line per run before its
table; compare's length table with many lengths in parts that fit instead of a list of one field
a line; a title wider than its table whole in a pipe."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from ablate.tables.render import print_table
from ablate.analysis.report import CompareOptions, build_report
from ablate.evaluation.length_record import EvalKey, EvalStatus, LengthResult
from ablate.evaluation.lengths import RunEval, format_run
from ablate.terminal import hang_line
from compare_fixtures import NA, write_lengths, write_run
from conftest import run_ablate, run_on_terminal
from test_eval_cli import run_of, sweep  # noqa: F401 (the trained sweep fixture)

WIDTHS = (80, 100, 120)
LONG = "/runs/sweeps/2026-11-29_06-56-47/3_pos=learned,train.seq_len=64,train.eval_lengths=64_128_256_512"


def assert_whole(shown: list[str], text: str, width: int) -> None:
    """Every line fits (a word longer than a line aside: the terminal folds it), no trailing
    spaces, and every word of the unbroken text is on one line."""
    for line in shown:
        assert len(line) <= width or " " not in line.strip(), (width, line)
        assert line == line.rstrip(), line
    words = {w for line in shown for w in line.split()}
    assert set(text.split()) <= words, set(text.split()) - words


@pytest.mark.parametrize("width", WIDTHS)
def test_an_eval_table_breaks_at_spaces_under_its_field(width):
    ev = RunEval(Path(LONG), 64, [LengthResult(EvalKey(64), EvalStatus.OK, 2.4912, 3.5941, 32768, 300),
                                  LengthResult(EvalKey(512), EvalStatus.NOT_AVAILABLE, reason=NA)])
    lines = format_run(ev, "windows", 32768)
    shown = [part for line in lines for part in hang_line(line, width)]
    assert_whole(shown, "\n".join(lines), width)
    na = next(i for i, line in enumerate(shown) if " n/a " in line)
    start = shown[na].index(NA[:9])
    if not shown[na].endswith(NA):  # the reason wraps within its own column
        assert shown[na + 1].startswith(" " * start + NA.split()[len(shown[na][start:].split())]), shown[na + 1]


def test_eval_on_a_terminal_prints_each_run_after_its_line_and_nothing_broken(sweep, tmp_path):
    name = "a-sweep-directory-with-a-rather-long-name"
    root, twin = (Path(shutil.copytree(sweep, tmp_path / side / name)) for side in ("terminal", "pipe"))
    code, text = run_on_terminal("eval", str(root), "--lengths", "16,128", columns=80)
    assert code == 0, text
    piped = run_ablate("eval", str(twin), "--lengths", "16,128")  # the same runs, piped: lines unbroken
    assert_whole(text.splitlines(), piped.stdout.replace(str(twin), str(root)), 80)
    learned, rope = run_of(root, "learned"), run_of(root, "rope")
    order = [text.index(s) for s in ("[1/2]", f"{learned}:", f"{learned}\n", "[2/2]", f"{rope}:",
                                     f"{rope}\n")]
    assert order == sorted(order)  # each run's line, then its table, before the next run's line


def _many_lengths(root: Path) -> Path:
    lengths = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    for i, pos in enumerate([None, "sinusoidal", "rope", "alibi", "nope"]):
        for seed in range(3):
            losses = {n: 3.0 + 0.02 * i + 0.1 * j + 0.01 * seed * (j + 1) for j, n in enumerate(lengths)}
            d = write_run(root, f"{pos or 'base'}_s{seed}", {"pos": pos} if pos else {}, seed, losses[64])
            write_lengths(d, losses)
    return root


@pytest.mark.parametrize("width", WIDTHS)
def test_many_lengths_are_printed_in_parts_that_fit_not_one_field_a_line(tmp_path, width):
    table = build_report([_many_lengths(tmp_path / "runs")], CompareOptions()).lengths.tables[0]
    console = Console(width=width, force_terminal=True, color_system=None, record=True)
    print_table(table, console)
    lines = console.export_text().splitlines()
    assert all(len(line) <= width for line in lines)
    heads = [line for line in lines if line.startswith("variant ")]
    shown = [w for h in heads for w in h.split() if re.fullmatch(r"\d+\*?", w)]
    assert shown == ["64", "128*", "256*", "512*", "1024*", "2048*", "4096*", "8192*"]  # each once, in order
    assert len(heads) == (2 if width == 80 else 1)
    loss_lines = [line for line in lines if line.split()[:1] == ["pos=rope"]]
    assert len(loss_lines) == len(heads)  # each part names each variant: no block of one field a line
    assert len(lines) < 60


def test_a_title_wider_than_its_table_is_one_line_in_a_pipe(tmp_path):
    root = tmp_path / "runs"
    for seed in range(2):
        for pos in (None, "rope"):
            d = write_run(root, f"{pos or 'base'}_s{seed}", {"pos": pos} if pos else {}, seed, 3.0 + seed / 10)
            write_lengths(d, {128: 3.1 + seed / 10})
    res = run_ablate("compare", str(root), env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "ablate compare: loss by evaluation length (mean over seeds; Holm per length)\n" in res.stdout
