"""Data: sources, tokenizers, the token cache and paired batches."""
