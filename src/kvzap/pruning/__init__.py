"""KV cache pruning at inference: scorers, the DMS threshold policy, physical eviction."""
