"""ablate: architecture ablations of decoder-only transformer language models.

Heavy dependencies (torch, wandb, datasets) are imported lazily by the modules that need them,
so that `ablate --help` and `ablate axes` stay fast.
"""

__version__ = "0.1.0"
