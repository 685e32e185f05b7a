"""How a stage says no. A Refusal names the problem and its fix; code that calls a stage as a library catches it,
and only a stage's entry point, wrapped by `entry_point`, turns it into an exit message (status 1, no traceback)."""

from __future__ import annotations

import functools


class Refusal(ValueError):
    """Input a stage will not run on: a bad argument, an earlier stage's missing output, an asset not installed."""


def entry_point(stage_main):
    """Marks a module's `main`: a Refusal raised anywhere below it ends the process with its message alone."""

    @functools.wraps(stage_main)
    def main(*args, **kwargs):  # the wrapped main: still the only place that exits
        try:
            return stage_main(*args, **kwargs)
        except Refusal as err:
            raise SystemExit(str(err)) from None

    return main
