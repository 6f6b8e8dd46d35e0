"""Mathematically equal per-event values are equal floats on every path. The IQM keeps {x : Q25 <= x <= Q75}: a tie
at a quartile split by one ulp moves the key by whole points (the kernel and the torch path once gave 15.8 and
13.5 % for `mouse/euclidean_iqmpe_pct` on the same ids)."""

import math
from fractions import Fraction

import pytest
import torch

from owa_metrics import Event, OWAEventMetrics
from owa_metrics.offline.evaluate import _pad
from owa_metrics.functional import euclidean_percent_error

from oracles import np_iqm


def test_equal_ratios_give_one_euclidean_error():
    k = torch.arange(1, 301, dtype=torch.float64)
    target, preds = torch.stack([k, k], 1), torch.stack([2 * k, k], 1)  # error (k, 0): ||e|| / ||g|| = 1 / sqrt(2)
    got = euclidean_percent_error(preds, target)
    assert got.unique().numel() == 1 and got[0].item() == pytest.approx(100 / math.sqrt(2), rel=1e-15)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_a_tie_at_the_upper_quartile_keeps_the_whole_tie(vocab, backend):
    """80 exact moves and 40 moves off by ||(k, 0)|| / ||(k, k)||: the upper quartile falls inside the tie, so the
    IQM is the mean of all 120 values (an oracle with the ratios as exact fractions)."""
    true = [(10, 0)] * 80 + [(k, k) for k in range(1, 41)]
    pred = [(10, 0)] * 80 + [(2 * k, k) for k in range(1, 41)]
    events = [[Event("mouse", 1_000_000 * (i + 1), dx=dx, dy=dy, button_flags=0, button_data=0)
               for i, (dx, dy) in enumerate(side)] for side in (pred, true)]
    p, t = (_pad([vocab.encode(side, ignore_images=True)]) for side in events)
    metric = OWAEventMetrics(vocab=vocab, alignment="generation", backend=backend)
    metric.update(p, t)
    errors = [100 * math.sqrt(Fraction((px - tx) ** 2 + (py - ty) ** 2, tx * tx + ty * ty))
              for (px, py), (tx, ty) in zip(pred, true)]
    assert float(metric.compute()["mouse/euclidean_iqmpe_pct"]) == pytest.approx(np_iqm(errors), rel=1e-12)
