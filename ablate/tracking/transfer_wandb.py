"""An --lr-grid or --ladder sweep's report in W&B: one run (job_type "transfer-report") in the
sweep's group holding the report as a wandb.Table and its figure, next to the jobs' own runs.
Offline without credentials, as every ablate run; a W&B failure is one warning line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

REPORT_JOB_TYPE = "transfer-report"


def table_rows(report) -> tuple[list[str], list[list]]:
    """The report's table as a W&B table: its csv fields, nested values as JSON."""
    keys, values = report.table.raw()
    cell = lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v
    return keys, [[cell(v) for v in row] for row in values]


def log_report(logger_cfg: Any, sweep_dir: Path, report, plot: Optional[Path]) -> Optional[str]:
    """Log the report; returns where it went (the offline run dir or the URL), None on failure."""
    from ablate.tracking.wandb_sink import clean_env_mode, first_line, resolve_mode

    os.environ.setdefault("WANDB_SILENT", "true")
    clean_env_mode()
    try:
        import wandb

        mode = resolve_mode(logger_cfg.mode)
        if mode == "disabled":
            return None
        run = wandb.init(mode=mode, project=logger_cfg.project, entity=logger_cfg.entity,
                         group=logger_cfg.group or Path(sweep_dir).name, job_type=REPORT_JOB_TYPE,
                         name=f"{report.kind}-report", dir=str(sweep_dir),
                         config={"transfer": report.kind}, settings=wandb.Settings(
                             init_timeout=float(logger_cfg.init_timeout), silent=True))
        keys, data = table_rows(report)
        logged = {f"{report.kind}/table": wandb.Table(columns=keys, data=data)}
        if plot is not None and Path(plot).is_file():
            logged[f"{report.kind}/plot"] = wandb.Image(str(plot))
        run.log(logged)
        for r in (row.as_dict() for row in report.rows):  # the headline numbers, searchable in the runs table
            for k in ("lr_sensitivity", "best_lr", "tuned_delta", "compute_multiplier"):
                if r.get(k) is not None:
                    run.summary[f"{r['variant']}/{k}"] = r[k]
        where = getattr(run, "url", None) if mode == "online" else str(Path(run.dir).parent)
        run.finish()
        return where
    except Exception as e:  # noqa: BLE001 - the dashboard never fails a finished sweep
        print(f"warning: could not log the sweep's report to W&B ({first_line(e)})")
        return None
