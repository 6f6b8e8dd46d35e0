"""Screens as context: a generated sequence's screen events taken out of the token ids before it is scored."""

from __future__ import annotations

import torch

from ..schema import ROLE_MASK, Role
from ..tokens.vocab import VocabMap

IGNORE_INDEX = -100


def without_screen_events(ids: torch.Tensor, vocab: VocabMap) -> torch.Tensor:
    """``ids`` [B, T] with every screen event's tokens taken out, the rest of each row shifted left and padded with
    -100 (the shape kept; no host sync). A screen event runs from an ``<EVENT_START>`` followed by ``<SCREEN>``
    through the next ``<EVENT_END>`` (or up to the next ``<EVENT_START>`` / the row's end when none comes first),
    whatever fills its image span: nothing, image tokens, ignored labels or junk."""
    roles = vocab.codes(ids) & ROLE_MASK
    T = ids.shape[1]
    start, end = roles == int(Role.START), roles == int(Role.END)
    screen = torch.zeros_like(start)
    screen[:, :-1] = start[:, :-1] & (roles[:, 1:] == int(Role.SCREEN))
    pos = torch.arange(T, device=ids.device).expand_as(ids)
    opened = torch.where(start, pos, -1).cummax(1).values  # each token's last <EVENT_START> (-1: none yet)
    ends_before = end.long().cumsum(1) - end.long()  # the <EVENT_END> tokens strictly before each token
    at = opened.clamp(min=0)
    inside = (opened >= 0) & screen.gather(1, at) & (ends_before == ends_before.gather(1, at))
    keep = ~inside
    slot = torch.where(keep, keep.long().cumsum(1) - 1, T)  # where a kept token goes; T: a discarded column
    out = torch.full((ids.shape[0], T + 1), IGNORE_INDEX, dtype=ids.dtype, device=ids.device)
    return out.scatter_(1, slot, ids)[:, :T]
