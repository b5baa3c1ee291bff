"""The shared trainer: one loop for every variant."""
