"""Issue 32, item 4: under DDP the callback drops the rows by which Lightning's DistributedSampler pads the ranks
(the 2-process runs: tests/test_callbacks.py, test_ddp_fit_with_every_default_logs_what_one_process_logs); here which
rows those are, against the samplers' own output."""

import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import DataLoader, DistributedSampler, Sampler, SequentialSampler

from owa_metrics.callbacks.lightning import padding_warning, real_rows


def _padding_rows(samplers, batch_size):
    """Per rank, per batch: how many first rows are not a repeat. The ranks' samples interleaved rank by rank are
    the sampler's padded list; a sample already seen earlier in it is padding."""
    lists = [list(s) for s in samplers]
    seen, repeat = set(), {}
    for i in range(max(map(len, lists))):
        for r, rows in enumerate(lists):
            if i < len(rows):
                repeat[r, i] = rows[i] in seen
                seen.add(rows[i])
    out = []
    for r, rows in enumerate(lists):
        flags = [repeat[r, i] for i in range(len(rows))]
        assert flags == sorted(flags)  # the padding is a suffix of the rank's list
        own = flags.count(False)
        out.append([min(max(own - b, 0), batch_size) for b in range(0, len(rows), batch_size)])
    return out


@pytest.mark.parametrize("n, world, batch_size", [(7, 2, 2), (7, 2, 3), (10, 4, 2), (8, 2, 2), (5, 3, 1)])
@pytest.mark.parametrize("wrapped", [False, True])
def test_the_padding_rows_are_those_the_sampler_repeats(n, world, batch_size, wrapped):
    data = list(range(n))
    samplers = [DistributedSamplerWrapper(SequentialSampler(data), num_replicas=world, rank=r, shuffle=False)
                if wrapped else DistributedSampler(data, num_replicas=world, rank=r, shuffle=False)
                for r in range(world)]
    want = _padding_rows(samplers, batch_size)
    for r, sampler in enumerate(samplers):
        loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
        got = [min(real_rows(loader, b), len(batch)) for b, batch in enumerate(loader)]
        assert got == want[r]
        assert sum(got) == len(range(r, n, world))  # each rank's own sequences, every one
    assert sum(map(sum, want)) == n


class EveryOther(Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self):
        return (self.n + 1) // 2


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_a_sampler_it_cannot_read_is_said_with_what_may_count_twice():
    data = list(range(7))
    loader = DataLoader(data, batch_size=2, sampler=EveryOther(7))
    assert real_rows(loader, 0) is None
    message = padding_warning(loader, 2)
    assert "EveryOther" in message and ": 1 sequences may be counted twice" in message
    assert ": 2 sequences" in padding_warning(loader, 3)
    assert "up to 3 sequences" in padding_warning(DataLoader(Stream(), batch_size=2), 4)  # no length: W - 1 at most
