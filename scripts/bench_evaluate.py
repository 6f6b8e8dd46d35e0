"""`owa-metrics evaluate` on one long line: the phases in-process and the whole command's wall time.

    python scripts/bench_evaluate.py [--mb 10 --out /tmp/owa_bench_evaluate]

Builds one JSON-lines target file holding a single ~``--mb`` MB line of hierarchical tokens (the three real
recordings in ../shared/data, repeated) and a prediction file with the same events, their timestamps off by 0,
0, +10 or -20 ms at random; then times reading, tokenizing, decode + update and compute (1 thread; the compile of
the kernel happens in a warm-up call first) and runs the CLI twice as a subprocess.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import subprocess
import time
from pathlib import Path

import torch

from owa_metrics import EventCodec, OWAEventMetrics
from owa_metrics.offline import evaluate as ev
from owa_metrics.events import read_recording

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def write_files(out: Path, n_chars: int) -> tuple[Path, Path]:
    codec, rng = EventCodec(), random.Random(0)
    events = [e for p in sorted(DATA.glob("*.mcap")) for e in read_recording(p)]
    true, pred, size = [], [], 0
    while size < n_chars:
        for e in events:
            true.append(codec.encode(e))
            jitter_ns = rng.choice([0, 0, 10_000_000, -20_000_000])
            pred.append(codec.encode(dataclasses.replace(e, timestamp_ns=e.timestamp_ns + jitter_ns)))
            size += len(true[-1])
            if size >= n_chars:
                break
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "pred.jsonl", out / "true.jsonl"
    for path, pieces in zip(paths, (pred, true)):
        path.write_text(json.dumps({"text": "".join(pieces)}) + "\n")
    print(f"{len(true):,} events, {size:,} characters per line")
    return paths


def phases(pred_path: Path, true_path: Path, mode: str) -> None:
    t0 = time.perf_counter()
    pred, true = ev.read_file(pred_path), ev.read_file(true_path)
    tokenizer = ev.build_tokenizer(format=ev.guess_format(true))
    metric = OWAEventMetrics(tokenizer, alignment="generation", mode=mode)
    metric.update(torch.tensor([1, 2]), torch.tensor([1, 2]))  # the kernel's compile / cache load, untimed
    metric.reset()
    t1 = time.perf_counter()
    pred_ids, true_ids = ev.to_ids(pred, tokenizer, metric.vocab), ev.to_ids(true, tokenizer, metric.vocab)
    t2 = time.perf_counter()
    metric.update(ev._pad(pred_ids), ev._pad(true_ids))
    t3 = time.perf_counter()
    report = metric.compute()
    t4 = time.perf_counter()
    print(f"{mode:6s} setup {t1 - t0:5.2f} s  tokenize {t2 - t1:5.2f} s  decode+update {t3 - t2:5.2f} s  "
          f"compute {t4 - t3:5.2f} s  ({int(report['count/target_events']):,} events)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/owa_bench_evaluate"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    pred_path, true_path = write_files(args.out, int(args.mb * 1e6))
    for mode in ("exact", "sketch"):
        phases(pred_path, true_path, mode)
    for run in range(2):
        start = time.perf_counter()
        subprocess.run(["owa-metrics", "evaluate", "--pred", str(pred_path), "--target", str(true_path),
                        "--json", str(args.out / "report.json")], check=True, capture_output=True)
        print(f"CLI run {run + 1}: {time.perf_counter() - start:.2f} s wall")


if __name__ == "__main__":
    main()
