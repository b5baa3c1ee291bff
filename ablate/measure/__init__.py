"""Measurements without a run directory: inspect, bench, the decode bench and the coordinate check."""
