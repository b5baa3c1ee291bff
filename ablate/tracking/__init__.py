"""Metric sinks and run analysis (`ablate compare`)."""
