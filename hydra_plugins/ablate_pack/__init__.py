"""hydra-submitit-launcher with several sweep jobs per array task (`ablate sweep --jobs-per-gpu K`):
the sweeper switches to these launchers when K jobs are to share one task's GPUs (see
pack_launcher.py). Hydra finds them by scanning the `hydra_plugins` namespace package."""
