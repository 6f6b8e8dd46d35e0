"""DDP sync cost of the metric state vs n: 2 CPU ranks (gloo), exact vs sketch mode, torchmetrics' sync and ours.

    python scripts/bench_sync.py [--sizes 10000 100000 1000000 3000000] [--repeats 5]

The ranks hold 55 % and 45 % of n signed percent errors in a `SignedPercentError` (ranks rarely hold equal shares);
the figures are the median times on rank 0 of ``metric.sync()`` by torchmetrics' own sync (what a ``dist_sync_fn``
of the user's gets: each state gathered alone) and by the metric's (`Float64Metric._sync_dist`, what ``compute()``
uses), alternately, each synced state checked equal to the other's, with the bytes one rank sends. ``--pieces`` k
appends the samples in k updates (exact mode keeps them in up to log2(k) + 1 tensors, as a validation epoch does).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchmetrics.utilities.distributed import gather_all_tensors

from owa_metrics import SignedPercentError


def torchmetrics_sync(tensor, group=None):
    """torchmetrics' default gather, passed as a ``dist_sync_fn`` of the user's: the metric then syncs as
    torchmetrics does."""
    return gather_all_tensors(tensor, group)


def _worker(rank: int, port: int, sizes: list[int], repeats: int, pieces: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    if rank == 0:
        print(f"{'n (both ranks)':>15} {'mode':<7} {'torchmetrics ms':>16} {'ours ms':>8} "
              f"{'bytes (rank 0)':>15}")
    for n in sizes:
        values = torch.randn(n * (55 - 10 * rank) // 100, generator=g, dtype=torch.float64) * 30 + 100
        truth = torch.full_like(values, 100.0)
        for mode in ("exact", "sketch"):
            metric = SignedPercentError(mode=mode)
            for part in range(pieces):
                metric.update(values[part::pieces], truth[part::pieces])
            state = metric.signed_percent_errors
            nbytes = sum(t.numel() * t.element_size() for t in state) if isinstance(state, list) else state.numel() * 8
            times: dict = {torchmetrics_sync: [], None: []}
            for _ in range(repeats):
                synced = []
                for fn, runs in times.items():
                    dist.barrier()
                    begin = time.perf_counter()
                    metric.sync(dist_sync_fn=fn)
                    runs.append(time.perf_counter() - begin)
                    synced.append(metric.signed_percent_errors.clone())
                    metric.unsync()
                torch.testing.assert_close(synced[0], synced[1], rtol=0, atol=0)
            if rank == 0:
                ms = [statistics.median(runs) * 1e3 for runs in times.values()]
                print(f"{n:>15,} {mode:<7} {ms[0]:>16.2f} {ms[1]:>8.2f} {nbytes:>15,}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6, 3 * 10**6])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pieces", type=int, default=1, help="updates the samples come in")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, args.sizes, args.repeats, args.pieces), nprocs=2, join=True)


if __name__ == "__main__":
    main()
