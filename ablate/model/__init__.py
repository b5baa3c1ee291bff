"""Model architecture. `spec` and `options` are torch-free; the rest builds nn.Modules."""
