"""The optimizer's parts (axis `optim`): its typed settings (`optim_settings.py`), the logical
matrices of a parameter, the one place the optimizer reads the model's structure
(`matrices.py`), Muon on those matrices (`muon.py`) and the container that puts one or more
optimizers behind one step (`container.py`). ablate/train/optimizer.py builds them for a run."""
