"""The torch path of `OWAEventMetrics.update` (the GPU path): how many torch ops it launches and how many host
syncs it would make on a GPU, counted on small CPU batches by `scripts/count_ops.py` (a profiler and a
``TorchDispatchMode`` that record aten calls, whatever the code under test does)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from count_ops import SyncCounter, cases, count  # noqa: E402

# (top-level ops, host syncs) at most per update; measured at 4 x 256: 280 / 296 / 311 / 469 ops (before issue 13:
# 737 / 799 / 774 / 809 ops, 18 / 18 / 21 / 20 syncs; after its first pass 406 / 441 / 443 / 380, its second
# 274 / 295 / 310 / 267; before issues 25 and 26: 234 / 250 / 265 / 236). Issue 25's key groups add 46 ops (every
# range of one true field in one comparison). The syncs: the number of target events (one nonzero), and in exact
# mode the numbers of comparable and of mouse rows, read in one; sketch mode keeps no samples. Syncs count what
# `count_ops.count` sees: host reads and data-sized outputs, and the tensors made of host data (a copy to a GPU).
# Issue 44 (item 5), no sync: + 13 ops in every case (the sums of the sequence means as exact integer parts,
# timestamp R² from ms), + 9 more with time pairing (the cosines' sum as exact parts).
LIMITS = {
    "teacher forcing, exact": (296, 2),
    "teacher forcing, sketch": (311, 1),
    # the CPU token loss runs in blocks of labelled positions, whose count it reads (no device to wait for on the
    # CPU); off the CPU the loss is dense and sync-free (`test_dense_token_loss_equals_the_blocks_without_a_sync`): 2
    "teacher forcing, logits": (329, 3),
    "teacher forcing, sketch, logits": (344, 2),
    "teacher forcing, token_loss": (318, 2),
    "teacher forcing, sketch, token_loss": (333, 1),
    # issue 26: + the cursor and key-sequence keys (~190 ops); the decoder decodes every generated event once and
    # reads the pairs from them. Syncs (issue 34): the numbers of events of both sides and the most keyboard type
    # tokens of a row of each side (one read: the bound of the key-sequence edit distance, computed on the device),
    # then the numbers of sampled rows and of new samples (NaN: none) in one read; before issue 34: 4 (and a copy
    # back to the device)
    # issue 32: + 29 ops, no sync, for the screens as context (`without_screen_events`, both sides in one pass)
    "generation (index)": (513, 2),
    "generation (index), sketch": (556, 1),
    # generation by time (issue 34): the decoder's read also holds the most events in a row of each side, the fixed
    # shapes of both greedy matchings (detection, kinds: the k-th events of all rows at once, no host sync), then the
    # samples' read; before: + per matching its number of edges and its rounds (log2) read, 5 / 4 (9 / 8 at 32 x 2048;
    # 18 before issue 34).
    "generation (time)": (941, 2),
    "generation (time), sketch": (999, 1),
    # the D2E bins (issue 34) add no sync: both sides' entries sorted by (bin, key name, side) in fixed shapes, a true
    # run meets its predicted one by a binary search; each case reads what it reads without them. Before: 29 / 28 /
    # 29 / 32 syncs (the numbers of bins and of keys per sequence and name), 668 / 683 / 911 / 1269 ops; with time
    # pairing at 2 syncs, generation by time with the bins: 1193 ops, 2 syncs. Issue 46: the moments exact (their
    # limbs: 21-bit digits and their products, exact in float64, carried): + 68 ops; the community's strict per-bin
    # keys (each bin's key names alike, by its first key-name run): + 38; no sync (609 / 624 / 852 / 1216 before)
    "teacher forcing, d2e": (717, 2),
    "teacher forcing, sketch, d2e": (732, 1),
    "generation (index), d2e": (960, 2),
    "generation (time), d2e": (1324, 2),
}


@pytest.fixture(scope="module")
def updates():
    return cases(4, 256)


@pytest.mark.parametrize("case", list(LIMITS))
def test_update_ops_and_syncs(updates, case):
    ops, syncs = count(updates[case])
    max_ops, max_syncs = LIMITS[case]
    assert sum(syncs.values()) <= max_syncs, dict(syncs)
    assert sum(ops.values()) <= max_ops, ops.most_common(10)


def test_dense_token_loss_equals_the_blocks_without_a_sync():
    from owa_metrics.functional.tokens import dense_token_losses, token_losses

    g = torch.Generator().manual_seed(0)
    target = torch.randint(-5, 40, (3, 50), generator=g)  # ids past the vocabulary (32) and ignored labels
    target = torch.where(target < 0, -100, target)
    logits = torch.randn(3, 50, 32, generator=g)
    logits[0, 1, 4] = float("nan")
    want = token_losses(logits, target, chunk_rows=16)
    with SyncCounter() as syncs:
        got = dense_token_losses(logits, target)
        blocks = dense_token_losses(logits, target, block_logits=7 * 32 + 5)  # 7 positions a block: 22 blocks
    assert syncs.total == 0, dict(syncs.calls)
    for result in (got, blocks):
        assert torch.equal(result[0], want[0]) and torch.equal(result[1], want[1])
    # numpy, from the definition: logsumexp(z) - z[label] at labelled positions; 0 and skipped when the label is past
    # the vocabulary or the loss is not finite
    z, labels = logits.double().numpy().reshape(-1, 32), target.numpy().reshape(-1)
    by_hand, skipped = np.zeros(len(labels)), 0
    for i, label in enumerate(labels):
        if label >= 0:
            loss = np.log(np.exp(z[i] - z[i].max()).sum()) + z[i].max() - z[i][min(label, 31)]
            ok = label < 32 and np.isfinite(loss)
            by_hand[i], skipped = (loss, skipped) if ok else (0.0, skipped + 1)
    np.testing.assert_allclose(got[0].numpy(), by_hand, rtol=1e-5, atol=1e-5)
    assert float(got[1]) == skipped > 0


def test_the_counter_sees_what_makes_a_gpu_wait():
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    with SyncCounter() as syncs:
        x.nonzero(), x[mask], x.masked_select(mask), bool(x.sum()), x[0].item(), torch.bincount(x.long())
        torch.unique(x), torch.repeat_interleave(x, torch.ones(6, dtype=torch.long))
    with SyncCounter() as none:
        torch.repeat_interleave(x, torch.ones(6, dtype=torch.long), output_size=6), x[torch.tensor([1, 2])], x.cumsum(0)
        torch.nonzero_static(mask, size=3), torch.zeros(3).index_add_(0, torch.tensor([0, 2]), torch.ones(2))
    assert syncs.total == 8, dict(syncs.calls)
    assert none.total == 0, dict(none.calls)


def test_the_counter_sees_host_data_that_a_gpu_update_would_copy():
    """With ``host_data``: a tensor made of a Python list, a Python number set into a tensor, and a numpy array made a
    tensor (a copy from pageable memory on a GPU) count; tensors made on the device (fills, factories) do not."""
    x = torch.zeros(4)
    with SyncCounter(host_data=True) as syncs:
        torch.tensor([1, 2, 3]), torch.from_numpy(np.arange(3)), torch.as_tensor(np.ones(2))
        x[1] = 5.0
    with SyncCounter(host_data=True) as none:
        x[1:].fill_(2.0), torch.full((3,), 7), torch.arange(5), torch.as_tensor(x), x.clamp(min=1)
    assert syncs.total == 4, dict(syncs.calls)
    assert none.total == 0, dict(none.calls)
