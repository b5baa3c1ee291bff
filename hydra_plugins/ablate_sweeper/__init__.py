"""ablate's Hydra sweeper plugin (one factor at a time, grid, explicit job lists, seeds).

Hydra finds it by scanning the `hydra_plugins` namespace package; the config is registered in
the ConfigStore under hydra/sweeper=ablate (see ablate_sweeper.py).
"""
