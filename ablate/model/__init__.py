"""Model architecture. `spec`, `axis` and `options` are torch-free; the rest builds nn.Modules."""
