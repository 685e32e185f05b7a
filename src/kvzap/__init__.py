"""KVzap: fast, adaptive and faithful KV cache pruning (arXiv 2601.07891), reproduced end to end."""

__version__ = "0.1.0"
