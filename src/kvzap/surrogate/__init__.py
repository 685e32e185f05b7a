"""Stage 3, surrogates: KVzap-Linear and KVzap-MLP, trained on the oracle shards, loaded like models."""
