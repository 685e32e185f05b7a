"""Stage 4, evaluation: one job per (model, benchmark entry, method, value), its methods, suites and metrics."""
