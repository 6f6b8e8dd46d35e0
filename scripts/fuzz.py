"""Hostile input through `OWAEventMetrics.update`: corrupted event sequences, ids of any integer dtype (past the
vocabulary, negative), logits narrower than the vocabulary and holding NaN / inf, generated batches without an event,
both formats, both alignments and both pairings of generation (by index, by time from random origins).

    python scripts/fuzz.py [--sequences 100000] [--seed 0]

Prints, per format, alignment and pairing, the sequences and target events pushed through, the exceptions raised (must
be 0), the target events counted against the string reference's spans (must be equal), the labelled tokens
left out of the loss against a numpy count (must be equal) and NaN keys in the report (must be 0).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch

from owa_metrics import EventCodec, OWAEventMetrics, VocabMap, build_tokenizer
from owa_metrics.events import simulate_session

DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def corrupted_rows(rng: np.random.Generator, vocab: VocabMap, stream: list[int], n: int) -> list[list[int]]:
    """``n`` id rows: slices of an event sequence's ids with replaced / deleted / inserted ids, -100 runs, ids past
    the vocabulary and negative ids."""
    named = np.array(sorted(vocab.ids.values()))
    rows = []
    for _ in range(n):
        start = int(rng.integers(0, len(stream) - 1))
        row = stream[start:start + int(rng.integers(0, 160))]
        for _ in range(int(rng.integers(0, 6))):
            at = int(rng.integers(0, len(row) + 1))
            op = rng.integers(0, 5)
            new = int(rng.choice([rng.choice(named), rng.integers(-300, vocab.size + 50), -100]))
            if op == 0 and at < len(row):
                row[at] = new
            elif op == 1:
                del row[at:at + int(rng.integers(1, 4))]
            elif op == 2:
                row.insert(at, new)
            elif op == 3:
                row[at:at + 6] = [-100] * len(row[at:at + 6])
        rows.append(row)
    return rows


def as_dtype(rows: list[list[int]], dtype: torch.dtype, width: int) -> torch.Tensor:
    """Rows padded with -100, in ``dtype``: ids a small dtype cannot hold become -100 (int8) or 0 (uint8)."""
    x = torch.tensor([r + [-100] * (width - len(r)) for r in rows], dtype=torch.int64)
    info = torch.iinfo(dtype)
    x = torch.where((x < info.min) | (x > info.max), -100 if info.min < 0 else 0, x)
    return x.to(dtype)


def poisoned_logits(rng: np.random.Generator, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
    """Random float32 logits, some narrower than the vocabulary, with NaN / +inf / -inf entries."""
    width = vocab_size if rng.random() < 0.5 else int(rng.integers(vocab_size // 2, vocab_size))
    logits = rng.standard_normal(size=(*shape, width), dtype=np.float32) * 2
    for value in (np.nan, np.inf, -np.inf):
        hits = rng.random(shape) < 0.01
        logits[hits, rng.integers(0, width)] = value
    return torch.from_numpy(logits)


def skipped_oracle(logits: torch.Tensor, target: torch.Tensor) -> int:
    """Labelled positions left out of the loss: label past the logits, or a non-finite cross-entropy (numpy)."""
    x, y = logits.double().numpy(), target.long().numpy()
    rows, labels = x[y >= 0], y[y >= 0]
    inside = labels < x.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        top = rows.max(axis=1, keepdims=True)
        ce = (top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
              - np.take_along_axis(rows, np.minimum(labels, x.shape[-1] - 1)[:, None], axis=1)[:, 0])
    return int((~inside | ~np.isfinite(ce)).sum())


MODES = (("teacher_forcing", "index"), ("generation", "index"), ("generation", "time"))  # (alignment, pairing)


def run(sequences: int, seed: int = 0, batch: int = 32) -> list[dict]:
    """Fuzz every format x mode (`MODES`); one dict of counts each (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for fmt in ("hierarchical", "factorized"):
        tokenizer = build_tokenizer(format=fmt)
        vocab = VocabMap.from_tokenizer(tokenizer)
        codec = EventCodec(vocab.config)
        events = vocab.encode(simulate_session(60, seed=seed, format=fmt)[:400], ignore_images=True)
        for alignment, pairing in MODES:
            metric = OWAEventMetrics(tokenizer, alignment=alignment, pairing=pairing, generated_screens="scored")
            counts = {"format": fmt, "alignment": alignment, "pairing": pairing, "sequences": 0, "exceptions": 0,
                      "target_events": 0, "reference_events": 0, "loss_skipped": 0, "oracle_skipped": 0, "nan_keys": 0}
            for _ in range(math.ceil(sequences / 2 / len(MODES) / batch)):
                rows = corrupted_rows(rng, vocab, events, batch)
                width = max([len(r) for r in rows] + [0])
                dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
                target = as_dtype(rows, dtype, width)
                counts["reference_events"] += sum(
                    len(codec.spans([vocab.token(int(i)) for i in row])) for row in target.long().tolist())
                if alignment == "teacher_forcing":
                    preds = as_dtype([r[:width] for r in corrupted_rows(rng, vocab, events, batch)], dtype, width)
                    logits = poisoned_logits(rng, tuple(target.shape), vocab.size)
                    counts["oracle_skipped"] += skipped_oracle(logits, target)
                else:  # one batch in 8 generated no event (-100 only, or no token)
                    generated = corrupted_rows(rng, vocab, events, batch) if rng.random() >= 1 / 8 else \
                        [[-100] * int(rng.integers(0, 3))] * batch
                    preds, logits = as_dtype(generated, dtype, max(len(r) for r in generated)), None
                origin = {"origin_ns": torch.from_numpy(rng.integers(-1, 2 ** 34, batch))} if pairing == "time" else {}
                try:
                    metric.update(preds, target, logits=logits, **origin)
                except Exception as err:  # noqa: BLE001 - counted: the fuzzer's figure of merit
                    counts["exceptions"] += 1
                    print(f"{fmt} {alignment} {pairing}: {type(err).__name__}: {err}")
                counts["sequences"] += batch
            with warnings.catch_warnings(record=True) as caught:  # the invalid-target warning: counted
                warnings.simplefilter("always")
                report = metric.compute()
            counts["warnings"] = len(caught)
            counts["target_events"] = int(report["count/target_events"])
            counts["loss_skipped"] = int(report.get("count/loss_skipped_tokens", 0))
            counts["nan_keys"] = sum(bool(torch.isnan(v)) for v in report.values())
            counts["report_keys"] = len(report)
            out.append(counts)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    begin = time.perf_counter()
    rows = run(args.sequences, args.seed)
    columns = list(rows[0])
    print("  ".join(f"{c:>16}" for c in columns))
    for row in rows:
        print("  ".join(f"{row[c]!s:>16}" for c in columns))
    print(f"{time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
    main()
