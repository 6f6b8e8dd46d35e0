"""DDP sync cost of the metric state vs n: 2 CPU ranks (gloo), exact vs sketch mode.

    python scripts/bench_sync.py [--sizes 10000 100000 1000000] [--repeats 5]

Each rank holds n / 2 signed percent errors in a `SignedPercentError`; the figure is the median time of
``metric.sync()`` (the all-gather or all-reduce torchmetrics does before compute) on rank 0, with the bytes
one rank sends.
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

from owa_metrics import SignedPercentError


def _worker(rank: int, port: int, sizes: list[int], repeats: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    if rank == 0:
        print(f"{'n (both ranks)':>15} {'mode':<7} {'sync ms':>9} {'bytes per rank':>15}")
    for n in sizes:
        values = torch.randn(n // 2, generator=g, dtype=torch.float64) * 30 + 100
        truth = torch.full_like(values, 100.0)
        for mode in ("exact", "sketch"):
            metric = SignedPercentError(mode=mode)
            metric.update(values, truth)
            state = metric.signed_percent_errors
            nbytes = sum(t.numel() * t.element_size() for t in state) if isinstance(state, list) else state.numel() * 8
            times = []
            for _ in range(repeats):
                dist.barrier()
                begin = time.perf_counter()
                metric.sync()
                times.append(time.perf_counter() - begin)
                metric.unsync()
            if rank == 0:
                print(f"{n:>15,} {mode:<7} {statistics.median(times) * 1e3:>9.2f} {nbytes:>15,}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, args.sizes, args.repeats), nprocs=2, join=True)


if __name__ == "__main__":
    main()
