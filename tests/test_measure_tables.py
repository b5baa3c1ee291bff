"""The tables of `ablate bench` (and --reference, --axes, --jobs-per-device), `bench --decode` (one
model, and options against the baseline), `inspect` and `coord-check` on the one table model
(ablate/tables/): at 80, 100 and 120 columns every line fits and ends without spaces, no name,
header word or figure is broken (coord-check's module names whole, its ± sd whole under its
slope; bench --decode's headers whole words), and what a narrow terminal leaves out is named;
piped, the full table with every header, the title and each line below it whole. Built from
results the commands wrote (tests/fixtures/measure/: their --json, which these tables never
change) and inspect's golden reports; a real terminal for bench --decode and coord-check."""

from __future__ import annotations

import json
import re

import pytest

from ablate.measure.bench_report import HINT, table_of, variants_table
from ablate.measure.coord_check import Module
from ablate.measure.coord_report import coord_table
from ablate.measure.inspect_report import inspect_tables
from ablate.tables.table import Table
from conftest import ROOT, assert_fits, run_on_terminal, table_in_pipe, table_on_terminal

FIXTURES = ROOT / "tests" / "fixtures" / "measure"
WIDTHS = (80, 100, 120)
INSPECTED = ("norm=dyt", "arch=llama", "param=completep model.n_layers=8 model.base_depth=2 model.base_width=64")


def result(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def tables() -> dict[str, Table]:
    out = {name: table_of(result(name)) for name in ("bench_reference", "bench_axes", "packing", "decode",
                                                     "decode_axes")}
    out["coord_check"] = coord_table(result("coord_check"))
    golden = json.loads((ROOT / "tests" / "golden" / "inspect.json").read_text())
    for key in INSPECTED:
        out.update({f"inspect {key} #{i}": t for i, t in enumerate(inspect_tables(golden[key]))})
    return out


def hidden_heads(text: str, table: Table) -> set[str]:
    """The headers a narrow terminal's note names as left out (written with no-break spaces)."""
    note = " ".join(text.split("hidden to fit", 1)[1:])
    return {c.head for c in table.columns if c.head and c.head.replace(" ", "\u00a0") in note}


def assert_whole(text: str, table: Table) -> None:
    """Every word of every row's cells and of every header the terminal shows is a word of the
    text: a word broken across lines ("basel" / "ine") is not."""
    words = set(text.split())
    hidden = hidden_heads(text, table)
    for c in table.columns:
        if c.head in hidden:
            continue
        forms = (c.head, c.header(False), c.header(True))  # one field a line, full, compact
        assert any(set(f.split()) <= words for f in forms), (c.head, text)
        for r in table.rows:
            assert any(set(f.split()) <= words for f in (c.cell(r), c.narrow(r))), (c.head, c.cell(r), text)
    for r in table.rows:
        name = table.columns[0].cell(r)
        assert any(name in line for line in text.splitlines()), (name, text)  # a row's name on one line


@pytest.mark.parametrize("width", WIDTHS)
def test_every_table_fits_the_terminal_with_nothing_broken(width):
    for name, table in tables().items():
        text = table_on_terminal(table, width, hint=HINT)
        assert_fits(text, width, table)
        assert_whole(text, table)
        if hidden_heads(text, table):
            assert HINT in " ".join(text.split()), name


def test_piped_each_table_is_whole_whatever_the_width():
    for name, table in tables().items():
        text = table_in_pipe(table)
        lines = text.splitlines()
        assert "hidden" not in text and table.title in lines, name  # the title a line of its own
        assert all(line in lines for line in table.foot), name
        for c in table.columns:
            assert c.header(False) in text, (name, c.head)
            for r in table.rows:
                assert c.cell(r) in text, (name, c.head, c.cell(r))


def test_coord_check_keeps_module_names_and_each_sd_under_its_slope_at_80_columns():
    table = coord_table(result("coord_check"))
    text = table_on_terminal(table, 80)
    for label in ("attention logits", "attention output", "embedding output", "output logits"):
        assert sum(line.startswith(label + " ") for line in text.splitlines()) == 1  # its row, whole
    sds = re.findall(r"± \d\.\d\d", text)
    assert len(sds) == 6 * 4 and not re.search(r"±\s*$", text, re.M)  # six modules x four steps, none split


def test_a_training_ratio_whose_rounds_disagree_is_marked_and_one_whose_rounds_agree_is_not():
    r = result("bench_axes")
    steady, unsteady = dict(r["rows"][0]), dict(r["rows"][0])
    steady.update(variant="steady", ratio=1.02, round_ratios=[1.0, 1.02, 1.04, 1.01])
    unsteady.update(variant="unsteady", ratio=1.02, round_ratios=[0.6, 1.0, 1.04, 1.9])
    table = variants_table({**r, "rows": [steady, unsteady]})
    ratio = next(c for c in table.columns if c.head == "ratio")
    assert [ratio.cell(x) for x in table.rows] == ["1.000", "1.020", "1.020*"]
    assert any(n.startswith("*: its rounds (the per-round ratios) disagree") for n in table.notes)
    assert not any(n.startswith("*:") for n in variants_table({**r, "rows": [steady]}).notes)


DIMS = ["model.d_model=32", "model.n_heads=4", "model.n_layers=1", "train.device=cpu", "train.threads=1"]


def test_a_real_terminal_shows_bench_decode_against_the_baseline_in_whole_words():
    code, text = run_on_terminal("bench", "--decode", *DIMS, "--vs", "attn=mqa", "--batch", "1,2", "--context",
                                 "4", "--new-tokens", "2", "--rounds", "2", "--warmup", "1", columns=80)
    assert code == 0, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    words = set(text.split())
    assert {"baseline", "decode", "tokens/s", "KV", "bytes/token", "ratio", "attn=mqa"} <= words, text
    assert "decode tokens/s of each option vs the baseline" in " ".join(text.split())


def test_a_real_terminal_shows_coord_check_at_80_columns_whole():
    code, text = run_on_terminal("coord-check", *DIMS[1:], "train.batch_size=2", "train.seq_len=8", "--widths",
                                 "16,32,64", "--steps", "2", "--seeds", "2", columns=80)
    assert code == 0, text
    table = text[text.index("coord-check: slope"):]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert sum(line.lstrip("│ ").startswith("attention logits ") for line in table.splitlines()) == 1
    assert len(re.findall(r"± \d\.\d\d", table)) == len(Module) * 2 and not re.search(r"±\s*$", table, re.M)
