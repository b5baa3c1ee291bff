"""The analysis of finished runs: what `ablate compare` (and the end of a sweep) reports.

- load.py: reading run directories (summary.json, config.yaml, metrics.jsonl) into Runs
- checks.py: which runs may share a table, --where filters, the metric
- groups.py: variants, their labels, the baseline and a study's ladder
- stats.py: the seed-noise test, Holm's correction, verdicts, seeds needed (typed results)
- compare.py: compare_dirs, one Row per variant
- columns.py: the one column list that every format renders; render.py: the formats
"""

from ablate.analysis.compare import Comparison, Row, Versus, compare_dirs, per_seed_rows  # noqa: F401
from ablate.analysis.load import CompareError, Run, find_runs  # noqa: F401
