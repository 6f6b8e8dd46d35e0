"""Decode throughput: the vectorized batch decoder vs the per-event string reference, on one batch.

    python scripts/bench_decode.py [--format both|hierarchical|factorized --batch 32 --seq-len 2048 --repeats 20
                                    --device cpu]

The batch is a realistic event mix from the desktop-session simulator (screens with their 67 image tokens
as -100 labels, mouse paths, typing, clicks, scrolls); predictions are the targets with 5% of the label
tokens replaced at random. Throughput counts label tokens (B x T positions) per second; the decoder's
figure is the median of ``--repeats`` runs, the reference's the median of 3. ``--format both`` (the default)
times the two token formats on the same simulated session, interleaved, and prints factorized / hierarchical.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from owa_metrics import VocabMap, build_tokenizer, decode_batch, reference_decode
from owa_metrics.events import simulate_session


def make_batch(vocab: VocabMap, batch: int, seq_len: int, seed: int = 0):
    events = simulate_session(duration_s=batch * seq_len / 25, seed=seed, format=vocab.config.format)
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
    parser.add_argument("--format", choices=["both", "hierarchical", "factorized"], default="both")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    formats = ["hierarchical", "factorized"] if args.format == "both" else [args.format]
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cases = {}
    for name in formats:
        vocab = VocabMap.from_tokenizer(build_tokenizer(format=name))
        preds, target = make_batch(vocab, args.batch, args.seq_len)
        n_events = len(decode_batch(preds, target, vocab))
        print(f"{name}: batch {args.batch} x {args.seq_len}: {target.numel()} label positions, "
              f"{int((target >= 0).sum())} non-ignored labels, {n_events} target events; torch {torch.__version__}")
        ref_s = timed(lambda: reference_decode(preds.tolist(), target.tolist(), vocab), 3)
        cases[name] = (vocab, preds.to(device), target.to(device), n_events, ref_s)

    print(f"{'format':<13} {'path':<30} {'threads':>7} {'median ms':>10} {'tokens/s':>14} {'events/s':>12} "
          f"{'vs reference':>12}")
    for name, (vocab, p, t, n_events, ref_s) in cases.items():
        print(f"{name:<13} {'string reference (per event)':<30} {'-':>7} {ref_s * 1e3:>10.1f} "
              f"{t.numel() / ref_s:>14,.0f} {n_events / ref_s:>12,.0f} {'1.0x':>12}")
    medians = {}
    for threads in ([1, torch.get_num_threads()] if device.type == "cpu" else [torch.get_num_threads()]):
        torch.set_num_threads(threads)
        for name, (vocab, p, t, n_events, ref_s) in cases.items():
            for _ in range(3):
                decode_batch(p, t, vocab)
            sync()
        runs = {name: [] for name in cases}
        for _ in range(args.repeats):  # the formats interleaved: the machine's noise hits both alike
            for name, (vocab, p, t, n_events, ref_s) in cases.items():
                runs[name].append(timed(lambda: (decode_batch(p, t, vocab), sync()), 1))
        for name, (vocab, p, t, n_events, ref_s) in cases.items():
            dec_s = medians[name, threads] = statistics.median(runs[name])
            print(f"{name:<13} {'decode_batch (' + device.type + ')':<30} {threads:>7} {dec_s * 1e3:>10.2f} "
                  f"{t.numel() / dec_s:>14,.0f} {n_events / dec_s:>12,.0f} {ref_s / dec_s:>11.0f}x")
        if len(cases) == 2:
            ratio = medians["factorized", threads] / medians["hierarchical", threads]
            print(f"{'':<13} {'factorized / hierarchical time':<30} {threads:>7} {ratio:>10.2f}")


if __name__ == "__main__":
    main()
