"""ablate/analysis/transfer_report.py: how a ladder's compute multipliers read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ablate.analysis.transfer_report import _mult, _mult_ci


@pytest.mark.parametrize("v", np.logspace(-5, 9, 141))
def test_a_multiplier_reads_back_within_five_percent_at_any_magnitude(v):
    shown = _mult(float(v))
    assert len(shown) <= 7, shown  # no eight-digit interval ends
    assert math.isclose(float(shown), v, rel_tol=0.05), (v, shown)


def test_multipliers_of_ordinary_size_keep_two_decimals_and_an_unreachable_end_is_infinity():
    assert _mult(4.7702) == "4.77" and _mult(None) == "-"
    assert _mult_ci([4.4451, 5.1212]) == "[4.45, 5.12]"
    assert _mult_ci([0.0011347, math.inf]) == "[0.0011, ∞]"
    assert _mult_ci([0.0074, 35033996.92]) == "[0.0074, 3.5e+07]"
