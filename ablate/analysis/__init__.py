"""The analysis of finished runs: what `ablate compare` (and the end of a sweep) reports.

- load.py: reading run directories (summary.json, config.yaml, metrics.jsonl) into Runs
- comparable.py: which runs may share a table, --where filters, the metric
- groups.py: variants, their labels, the baseline and a study's ladder
- stats.py: the seed-noise test, Holm's correction, verdicts, seeds needed (typed results)
- compare.py: compare_dirs, one Row per variant (SeedRow per run)
- crossing.py: two crossed axes (a --mode grid sweep, --cross A,B): each run's cell, what the grid
  explains; interaction.py: the Δ of A at each level of B and their interaction, its table
- transfer_stats.py, transfer_report.py: an --lr-grid or --ladder sweep's statistics and rows
- length_eval.py: the loss at other context lengths (length_eval.json), tables under the comparison
- columns.py: the comparison's columns on the one table model (ablate/tables/)
- report_types.py: a Report and its kinds; report.py: which report compare gives (build_report)
  from its options (CompareOptions)
"""

from ablate.analysis.compare import Comparison, Row, SeedRow, Versus, compare_dirs, compare_runs, per_seed_rows  # noqa: F401
from ablate.analysis.load import CompareError, Run, find_runs  # noqa: F401
from ablate.analysis.report import CompareOptions, Report, ReportKind, build_report  # noqa: F401
