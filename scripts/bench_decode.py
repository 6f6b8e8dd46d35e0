"""Decode throughput: the vectorized batch decoder vs the per-event string reference, on one batch.

    python scripts/bench_decode.py [--batch 32 --seq-len 2048 --repeats 20 --device cpu]

The batch is a realistic event mix from the desktop-session simulator (screens with their 67 image tokens
as -100 labels, mouse paths, typing, clicks, scrolls); predictions are the targets with 5% of the label
tokens replaced at random. Throughput counts label tokens (B x T positions) per second; the decoder's
figure is the median of ``--repeats`` runs, the reference's the median of 3.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from owa_metrics import VocabMap, build_tokenizer, decode_batch, reference_decode
from owa_metrics.events import simulate_session


def make_batch(vocab: VocabMap, batch: int, seq_len: int, seed: int = 0):
    events = simulate_session(duration_s=batch * seq_len / 25, seed=seed)
    sequences = vocab.encode_sequences(events, seq_len, ignore_images=True)[:batch]
    if len(sequences) < batch:
        raise RuntimeError("simulated session too short for the batch")
    target = torch.tensor([s + [-100] * (seq_len - len(s)) for s in sequences])
    g = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, vocab.size, target.shape, generator=g)
    preds = torch.where(torch.rand(target.shape, generator=g) < 0.05, noise, target.clamp(min=0))
    return preds, target


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    vocab = VocabMap.from_tokenizer(build_tokenizer())
    preds, target = make_batch(vocab, args.batch, args.seq_len)
    positions = target.numel()
    n_events = len(decode_batch(preds, target, vocab))
    print(f"batch {args.batch} x {args.seq_len}: {positions} label positions, {int((target >= 0).sum())} "
          f"non-ignored labels, {n_events} target events; torch {torch.__version__}")

    ref_s = timed(lambda: reference_decode(preds.tolist(), target.tolist(), vocab), 3)
    print(f"{'path':<34} {'threads':>7} {'median ms':>10} {'tokens/s':>14} {'events/s':>12} {'vs reference':>12}")
    print(f"{'string reference (per event)':<34} {'-':>7} {ref_s * 1e3:>10.1f} {positions / ref_s:>14,.0f} "
          f"{n_events / ref_s:>12,.0f} {'1.0x':>12}")
    device = torch.device(args.device)
    p, t = preds.to(device), target.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for threads in ([1, torch.get_num_threads()] if device.type == "cpu" else [torch.get_num_threads()]):
        torch.set_num_threads(threads)
        for _ in range(3):
            decode_batch(p, t, vocab)
        sync()
        dec_s = timed(lambda: (decode_batch(p, t, vocab), sync()), args.repeats)
        print(f"{'decode_batch (' + device.type + ')':<34} {threads:>7} {dec_s * 1e3:>10.2f} {positions / dec_s:>14,.0f} "
              f"{n_events / dec_s:>12,.0f} {ref_s / dec_s:>11.0f}x")


if __name__ == "__main__":
    main()
