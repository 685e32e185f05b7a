"""A tensor that grows at its end and is consumed from its front along one dim: a cache layer's window.

Every decoding step appends a token to the window and judges the oldest one; re-allocating the window for
each (torch.cat, then a copy of what stays) is a fixed cost per step and layer that does not depend on the
context. Appends write into spare room instead (a sixteenth of the live size, so held bytes stay close to the
window's), the front only moves an offset, and the live part is copied into a fresh buffer when the spare
runs out or more than half the buffer is dead (so a long prefill's judged tokens are freed at once).
"""

from __future__ import annotations

import torch

SLACK = 1 / 16  # spare room a full buffer gets, as a fraction of its live entries: one move per ~window/16 steps


class SlidingBuffer:
    def __init__(self, data: torch.Tensor, dim: int):
        self.dim = dim % data.dim()
        self.buffer, self.begin, self.end = data, 0, data.shape[dim]

    @property
    def data(self) -> torch.Tensor:
        """The live entries: a view of the buffer."""
        return self.buffer.narrow(self.dim, self.begin, self.end - self.begin)

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    def newest(self, n: int) -> torch.Tensor:
        """The n newest live entries (one view op: this runs per token and layer)."""
        return self.buffer.narrow(self.dim, self.end - n, n)

    def append(self, new: torch.Tensor) -> None:
        """Write `new` after the live entries, first moving them to a buffer with SLACK spare room if full."""
        n = new.shape[self.dim]
        if self.end + n > self.buffer.shape[self.dim]:
            needed = self.end - self.begin + n
            self._move(needed + max(1, int(needed * SLACK)))
        self.buffer.narrow(self.dim, self.end, n).copy_(new)
        self.end += n

    def drop_front(self, n: int) -> None:
        """Forget the n oldest entries; once they outnumber the live ones, move the live ones to a snug buffer."""
        self.begin += n
        if self.begin > self.end - self.begin:
            self._move(self.end - self.begin)

    def drop_back(self, n: int) -> None:
        self.end -= n

    def _move(self, room: int) -> None:
        live = self.data
        shape = list(live.shape)
        shape[self.dim] = room
        self.buffer = live.new_empty(shape)
        self.buffer.narrow(self.dim, 0, live.shape[self.dim]).copy_(live)
        self.begin, self.end = 0, live.shape[self.dim]
