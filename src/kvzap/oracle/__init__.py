"""Stage 2, oracle data: KVzip / KVzip+ scores of every context token, streamed to checksummed shards."""
