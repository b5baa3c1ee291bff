"""The one table model (table.py: typed Columns over typed rows) and its one renderer (render.py:
the terminal's table at any width and in a pipe, markdown, LaTeX, csv, JSON), shared by every
command that prints a table: compare, bench, bench --decode, inspect, coord-check."""
