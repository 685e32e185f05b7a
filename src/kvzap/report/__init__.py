"""Stage 5, report: every cell into the paper's tables and figures."""
