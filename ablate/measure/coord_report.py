"""The table of `ablate coord-check`: its record (the `--json` dict of CoordCheck.to_json,
ablate/measure/coord_check.py, unchanged by this module) as typed rows and the Columns of the one
table model (ablate/tables/table.py): per module, the slope of log mean |x| against log size at
the first steps, mean ± sd over the seeds, and its mean |x| at the smallest and largest size.
Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ablate.measure.coord_check import Module
from ablate.names import LR
from ablate.tables.table import Align, Column, JsonRow, Table

TABLE_STEPS = 5  # step columns in the table (all of them in --json and --plot)


@dataclass
class SlopeRow(JsonRow):
    module: str  # its label ("attention logits")
    slopes: list  # (mean, sd or None) at each shown step; mean None: a non-finite activation
    first: Optional[float]  # mean |x| at the last step, smallest size (mean over seeds)
    last: Optional[float]  # ... largest size


def shown_steps(steps: int) -> list[int]:
    """Every step up to TABLE_STEPS of them; else the first three, the middle and the last."""
    if steps <= TABLE_STEPS:
        return list(range(1, steps + 1))
    return sorted({1, 2, 3, (steps + 1) // 2, steps})


def _slope(slope: tuple, sep: str = " ") -> str:
    """+0.12 ± 0.03 (compact: the ± sd on a line of its own)."""
    mean, sd = slope
    if mean is None:  # nan: a non-finite activation
        return "nan"
    return f"{mean:+.2f}" + ("" if sd is None else f"{sep}± {sd:.2f}")


def _size(v: Optional[float]) -> str:
    return "nan" if v is None else f"{v:.3g}"


def coord_table(c: dict) -> Table:
    """`ablate coord-check`'s record as its table; the reading and the setting below it."""
    steps, sizes, sweep = c["steps"], c["sizes"], c["sweep"]
    shown = shown_steps(steps)
    slopes = {(s["module"], s["step"]): (s["mean"], s["spread"]) for s in c["slopes"]}

    def mean_at(module: str, size: int) -> Optional[float]:
        vals = [v["mean"] for v in c["values"] if (v["module"], v["size"], v["step"]) == (module, size, steps)]
        return None if None in vals or not vals else math.fsum(vals) / len(vals)

    rows = [SlopeRow(m.label, [slopes[m.value, t] for t in shown], mean_at(m.value, sizes[0]),
                     mean_at(m.value, sizes[-1])) for m in Module]
    last = f"mean |x| at t={steps}: {sizes[0]} -> {sizes[-1]}"
    columns = [Column("module", lambda r: r.module, ("module",), align=Align.LEFT)]
    columns += [Column(f"t={t}", (lambda r, i=i: _slope(r.slopes[i])),
                       compact=(lambda r, i=i: _slope(r.slopes[i], "\n"))) for i, t in enumerate(shown)]
    columns.append(Column(last, lambda r: f"{_size(r.first)} -> {_size(r.last)}",
                          short=f"mean |x| at t={steps}:\n{sizes[0]} -> {sizes[-1]}",
                          compact=lambda r: f"{_size(r.first)} ->\n{_size(r.last)}"))
    base = f"; base {sweep} {c['base']}" if c["base"] is not None else ""
    foot = [f"param={c['param']}{base}; {sweep}s {','.join(map(str, sizes))}; lr {c[LR]:g} constant; batch "
            f"{c['batch_size']} x {c['seq_len']} tokens; {c['device']}, {c['precision']}; t=1: at init; layers "
            "averaged, the residual stream the last block's (--json: each layer)",
            c["reading"]]
    return Table(f"coord-check: slope of log mean |x| against log {sweep} (mean ± sd over {c['seeds']} seeds)",
                 columns, rows, foot=foot)
