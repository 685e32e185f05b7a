"""The paper's surrogate ablations, each its own rule: training data (sizes, sources) and (k, v) input."""
