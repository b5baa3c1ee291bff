"""Configuration: the typed schema, composing and checking a config, the axes' listing."""
