"""Screens as context: a generated sequence's screen events taken out of the token ids before it is scored."""

from __future__ import annotations

import numpy as np
import torch

from ..schema import ROLE_MASK, Role
from ..tokens.vocab import VocabMap
from .kernel import _jit

IGNORE_INDEX = -100


def without_screen_events(ids: torch.Tensor, vocab: VocabMap, compiled: bool = False) -> torch.Tensor:
    """``ids`` [B, T] with every screen event's tokens set to -100 (ignored: outside every event span, so that the
    decoder neither sees nor counts the event); no host sync. A screen event runs from an ``<EVENT_START>`` followed
    by ``<SCREEN>`` through the next ``<EVENT_END>`` (or up to the next ``<EVENT_START>`` / the row's end when none
    comes first), whatever fills its image span: nothing, image tokens, ignored labels or junk. ``compiled`` (CPU
    tensors, numba): the same in one pass over each row that reads each id's role too (`_mask_screens`)."""
    if compiled:
        out = np.empty(ids.shape, dtype=np.int64)
        _mask_screens(ids.numpy(), vocab.codes_table.numpy(), int(Role.START), int(Role.END), int(Role.SCREEN),
                      IGNORE_INDEX, out)
        return torch.from_numpy(out).to(ids.dtype)
    roles = vocab.codes(ids) & ROLE_MASK
    start, end = roles == int(Role.START), roles == int(Role.END)
    screen = start & torch.nn.functional.pad(roles[:, 1:] == int(Role.SCREEN), (0, 1))
    pos = torch.arange(ids.shape[1], device=ids.device)
    # each token's last struct token (at or before it; -1 reads position 0, never a screen's start then)
    last = torch.where(start | end, pos, -1).cummax(1).values.clamp(min=0)
    body = screen.gather(1, last)  # from a screen's <EVENT_START> up to the next struct token
    return ids.masked_fill(body | (end & torch.nn.functional.pad(body[:, :-1], (1, 0))), IGNORE_INDEX)


@_jit
def _mask_screens(ids, table, start, end, screen, ignore, out):
    """`without_screen_events` row by row: a token is a screen's while the last struct token at or before it is an
    ``<EVENT_START>`` followed by ``<SCREEN>``; an ``<EVENT_END>`` right after such a token closes the screen. Each
    id's role is read from ``table`` (`VocabMap.codes_table`: ``table[clamp(id, -1, size) + 1] & ROLE_MASK``, as
    `VocabMap.codes`)."""
    size, T = table.shape[0] - 2, ids.shape[1]
    for b in range(ids.shape[0]):
        body = previous = False
        following = table[min(max(ids[b, 0], -1), size) + 1] & ROLE_MASK if T > 0 else 0
        for t in range(T):
            role = following  # the role of token t, then of token t + 1 (none past the row's end)
            following = table[min(max(ids[b, t + 1], -1), size) + 1] & ROLE_MASK if t + 1 < T else -1
            if role == start:
                body = following == screen
            elif role == end:
                body = False
            out[b, t] = ignore if body or (role == end and previous) else ids[b, t]
            previous = body
