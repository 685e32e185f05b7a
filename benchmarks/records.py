"""What every benchmark script prints: its records as one table (tabulate), the chosen columns in order."""

from __future__ import annotations

from tabulate import tabulate


def print_table(records: list[dict], keys: list[str]) -> None:
    if records:
        print(tabulate([[r[k] for k in keys] for r in records], headers=keys, floatfmt=".3f"))
