"""A ladder with an LR grid says how far each variant's best LR moves from the smallest rung to
the largest (`lr_steps_moved`, in grid steps; negative: a smaller LR at the largest rung), the
measure of learning-rate transfer; an lr_rule mup ladder runs every rung at the one LR its scan
at the smallest rung picked, and says so. Constructed runs, so every best LR is known."""

from __future__ import annotations

import itertools
import math

import pytest

from ablate.analysis.transfer_stats import log_grid
from ablate.analysis.transfer_report import Point, ladder_report
from compare_fixtures import ladder_record

GRID = log_grid(1e-3, 1e-1, 5)
COMPUTES = [1e9, 1e10, 1e11]
RUNGS = [(f"r{i}", 16 * (i + 1), i + 1) for i in range(3)]


def _record(lr_rule: str = "fixed", grid=GRID, seeds: int = 1):
    return ladder_record(RUNGS, grid or (), lr_rule, seeds)


def _loss(rung: int, lr: float, best: float, seed: int) -> float:
    """A bowl in log LR around `best`, lower on larger rungs, a little seed noise."""
    return 3.0 - 0.3 * rung + 0.05 * math.log(lr / best) ** 2 + 0.002 * seed


def _scan_points(variant: str, best_index: list, seeds: int = 2) -> list[Point]:
    """Every seed of `variant` at every grid LR on every rung; its best on rung i is GRID[best_index[i]]
    (None: every LR diverged there)."""
    out = []
    for (i, compute), lr, seed in itertools.product(enumerate(COMPUTES), GRID, range(seeds)):
        b = best_index[i]
        loss = None if b is None else _loss(i, lr, GRID[b], seed)
        out.append(Point(variant, seed, lr, f"r{i}", loss, 5.0, compute, None, f"{variant}/{i}/{lr}/{seed}"))
    return out


def _steps_between(small: float, large: float) -> int:
    """Grid steps from one LR to another, from the grid's constant ratio (independent of the
    report's index lookup)."""
    return round(math.log(large / small) / math.log(GRID[1] / GRID[0]))


@pytest.mark.parametrize("first, last", list(itertools.product(range(5), range(5))))
def test_lr_steps_moved_counts_grid_steps_from_the_smallest_rung_to_the_largest(first, last):
    report = ladder_report(_scan_points("baseline", [2, 2, 2]) + _scan_points("v", [first, 2, last]),
                           _record())
    base, v = report.rows
    assert [r["best_lr"] for r in v["rungs"]] == [GRID[first], GRID[2], GRID[last]]
    assert v["lr_steps_moved"] == _steps_between(GRID[first], GRID[last]) == last - first
    assert base["lr_steps_moved"] == 0
    heads, cells = report.table.text_cells()
    moved = heads.index("LR moved r0→r2")
    assert cells[1][moved] == ("0" if last == first else f"{last - first:+d}")
    csv_names, csv_rows = report.table.raw()
    assert csv_rows[1][csv_names.index("lr_steps_moved")] == last - first
    assert any(n.startswith("LR moved: grid steps (x3.16 each) from the best LR at r0 to the best at r2; "
                            "negative: a smaller LR at r2") for n in report.notes)


def test_a_rung_where_every_lr_diverged_moves_no_steps_it_can_count():
    report = ladder_report(_scan_points("baseline", [1, 1, 3]) + _scan_points("v", [1, 2, None]), _record())
    assert report.rows[0]["lr_steps_moved"] == 2
    assert report.rows[1]["lr_steps_moved"] is None
    heads, cells = report.table.text_cells()
    assert cells[1][heads.index("LR moved r0→r2")] == "-"


def test_a_ladder_without_a_grid_has_no_lr_steps_moved():
    points = [p for p in _scan_points("baseline", [2, 2, 2]) + _scan_points("v", [2, 2, 2]) if p.lr == GRID[2]]
    report = ladder_report(points, _record(grid=None))
    assert all("lr_steps_moved" not in row.as_dict() for row in report.rows)
    assert not any(h.startswith("LR moved") for h in report.table.text_cells()[0])


def test_an_lr_rule_mup_ladder_runs_every_rung_at_the_smallest_rungs_pick():
    """The sweep's two phases as run: seed 0 of each variant at every grid LR on r0; then seed 1 on
    r0 and both seeds on r1 and r2 at that variant's best LR of r0."""
    picks = {"baseline": 1, "v": 3}
    points = []
    for variant, pick in picks.items():
        scan = _scan_points(variant, [pick, pick, pick])
        points += [p for p in scan if (p.rung == "r0" and p.seed == 0) or p.lr == GRID[pick]]
    report = ladder_report(points, _record("mup"))
    for row in report.rows:
        pick = GRID[picks[row["variant"]]]
        assert [r["best_lr"] for r in row["rungs"]] == [pick] * 3
        assert [r["n"] for r in row["rungs"]] == [2, 2, 2]  # the scan's other LRs are not counted
        for i, r in enumerate(row["rungs"]):
            assert r["mean"] == pytest.approx((_loss(i, pick, pick, 0) + _loss(i, pick, pick, 1)) / 2)
        assert row["lr_steps_moved"] is None  # one scan: nothing moves that was measured
    assert not any(h.startswith("LR moved") for h in report.table.text_cells()[0])
    assert any(n.startswith("lr_rule mup: one LR scan, at r0; every rung ran at each variant's best LR "
                            "there") for n in report.notes)


def test_an_lr_rule_mup_pick_on_the_grids_edge_is_noted_once():
    points = []
    for variant, pick in {"baseline": 0, "v": 2}.items():
        scan = _scan_points(variant, [pick, pick, pick])
        points += [p for p in scan if (p.rung == "r0" and p.seed == 0) or p.lr == GRID[pick]]
    notes = ladder_report(points, _record("mup")).notes
    edge = [n for n in notes if "on the grid's edge" in n]
    assert edge == ["baseline at r0: the best LR 0.001 is on the grid's edge; widen the grid"]


@pytest.mark.parametrize("seeds", [1, 2, 3])
def test_the_note_on_each_rungs_own_best_lr_says_which_seeds_ran_there(seeds):
    report = ladder_report(_scan_points("baseline", [2, 2, 2], seeds) + _scan_points("v", [1, 2, 3], seeds),
                           _record(seeds=seeds))
    note = next(n for n in report.notes if n.startswith("each variant on each rung at its own best LR"))
    assert note.endswith("(seeds 1.. ran there)" if seeds > 1 else ", seed 0 only")
