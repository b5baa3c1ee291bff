"""A finished run evaluated: its loss at other context lengths, and text sampled from it."""
