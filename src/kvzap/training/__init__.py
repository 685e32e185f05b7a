"""The training half of the workflow: the oracle corpus, oracle collection into checksummed shards, surrogate
fitting and threshold calibration, each a stage with a thin `main()` (the library parts they call live in
kvzap.oracle, kvzap.surrogate and kvzap.pruning)."""
