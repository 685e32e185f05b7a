"""KVzap-Linear and KVzap-MLP surrogates: the model, its checkpoints and their loading (library)."""
