"""A run: the Hydra entry point, its directory, its record, its lifecycle and its trained model."""
