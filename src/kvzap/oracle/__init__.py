"""KVzip / KVzip+ oracle scores of a context, from the attention the model computes (library)."""
