"""`ablate compare`'s KV-cache bytes per token: each variant's, from its run's config.yaml at the
run's compute dtype (what `ablate inspect --dtype` gives), in --json (`kv_cache_bytes_per_token`),
csv and the table; the first column a narrow terminal leaves out."""

from __future__ import annotations

import csv
import io
import json

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from ablate.analysis import compare_dirs
from ablate.analysis.columns import COMPARE_HINT, comparison_table
from ablate.tables.render import print_table
from ablate.measure.inspect import inspect_config
from compare_fixtures import by_name, cli, make_fixture, write_run
from conftest import compose

DIMS = ["model.d_model=64", "model.n_heads=8", "model.n_layers=3"]  # head_dim 8
KV_HEADS = {"mha": 8, "gqa": 2, "mqa": 1}
VARIANTS = {"mha": [], "gqa": ["attn=gqa", "model.n_kv_heads=2"], "mqa": ["attn=mqa"]}


def expected(attn: str, bytes_per_elem: int) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per element, from the dims above."""
    return 2 * 3 * KV_HEADS[attn] * (64 // 8) * bytes_per_elem


def write_variant(root, attn: str, seed: int, precision=None, config_precision="auto", device="cpu"):
    """A run as `ablate run` leaves it: its resolved config.yaml; the record's precision as the
    trainer resolved it (None: a record without it)."""
    overrides = DIMS + VARIANTS[attn] + [f"train.precision={config_precision}", f"train.device={device}"]
    d = write_run(root, f"{attn}_s{seed}", {"attn": attn} if attn != "mha" else {}, seed, 3.0 + seed / 10)
    (d / "config.yaml").write_text(OmegaConf.to_yaml(compose(overrides)))
    summary = json.loads((d / "summary.json").read_text())
    summary.pop("precision")
    if precision is not None:
        summary["precision"] = precision
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.mark.parametrize("precision, width", [("fp32", 4), ("bf16", 2)])
def test_each_variant_shows_its_kv_cache_bytes_at_its_compute_dtype(tmp_path, precision, width):
    for attn in KV_HEADS:
        for seed in (0, 1):
            write_variant(tmp_path, attn, seed, precision=precision)
    res = cli("compare", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    rows = by_name(json.loads(res.output))
    got = {attn: rows["baseline" if attn == "mha" else f"attn={attn}"]["kv_cache_bytes_per_token"] for attn in KV_HEADS}
    assert got == {attn: expected(attn, width) for attn in KV_HEADS}
    assert got["mha"] == 4 * got["gqa"] == 8 * got["mqa"]  # n_heads / n_kv_heads times smaller
    for attn in KV_HEADS:  # the number `ablate inspect` prints for the same config and dtype
        cfg = compose(DIMS + VARIANTS[attn])
        assert inspect_config(cfg, dtype=precision)["kv_cache_bytes_per_token"] == got[attn]


@pytest.mark.parametrize("record, config, device, width", [
    (None, "bf16", "cpu", 2),  # an older record without the resolved precision: the config's
    (None, "fp32", "auto", 4),
    (None, "auto", "cpu", 4),  # auto is fp32 on a CPU
    (None, "auto", "auto", None),  # auto on a device the record does not name: not known
    ("bf16", "auto", "auto", 2),  # the record's, as the trainer resolved it
])
def test_the_compute_dtype_comes_from_the_record_else_the_config(tmp_path, record, config, device, width):
    write_variant(tmp_path, "gqa", 0, precision=record, config_precision=config, device=device)
    row = compare_dirs([tmp_path])[0]
    assert row.kv_cache_bytes_per_token == (expected("gqa", width) if width else None)


def test_a_run_without_a_config_compares_with_no_kv_figure(tmp_path):
    write_variant(tmp_path, "mqa", 0, precision="fp32")
    d = write_variant(tmp_path, "mha", 0, precision="fp32")
    (d / "config.yaml").unlink()
    res = cli("compare", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    values = sorted((r["kv_cache_bytes_per_token"] is None, r["kv_cache_bytes_per_token"]) for r in json.loads(res.output))
    assert values == [(False, expected("mqa", 4)), (True, None)]


def test_csv_and_markdown_carry_the_column(tmp_path):
    write_variant(tmp_path, "mha", 0, precision="fp32")
    write_variant(tmp_path, "mqa", 0, precision="fp32")
    out = cli("compare", str(tmp_path), "--format", "csv").output
    rows = list(csv.DictReader(io.StringIO(out[out.index("variant,"):])))
    assert sorted(int(r["kv_cache_bytes_per_token"]) for r in rows) == [expected("mqa", 4), expected("mha", 4)]
    md = cli("compare", str(tmp_path), "--format", "markdown").output
    assert "KV cache bytes/token" in md and f"| {expected('mha', 4):,} |" in md


def test_a_narrow_terminal_leaves_the_kv_column_out_first(tmp_path):
    cmp = compare_dirs([make_fixture(tmp_path) / "ab"])

    def shown(width: int) -> str:
        console = Console(width=width, force_terminal=True, color_system=None, record=True)
        print_table(comparison_table(cmp), console, False, COMPARE_HINT)
        return " ".join(console.export_text().split())

    assert "hidden to fit 120 columns: KV cache bytes/token (" in shown(120)
    assert "hidden" not in shown(130) and "bytes/token" in shown(130) and "1,024 100 ok" in shown(130)
