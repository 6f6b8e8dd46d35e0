"""The whole report of `OWAEventMetrics` on a fixed corpus, saved, to compare two versions of the code.

    cd scripts && PYTHONPATH=<tree A> python compare_reports.py save a.pt
    cd scripts && PYTHONPATH=<tree B> python compare_reports.py save b.pt
    python compare_reports.py compare a.pt b.pt

The corpus: `fuzz.py`'s corrupted rows of noisy simulated sessions, both formats; every configuration: teacher
forcing (logits in every other batch), generation paired by index and by time, exact and sketch, the torch and the
kernel path (24); and each of them again with three tags (by row) and the D2E protocol on (``bin_ms=50``), every
key of every tag reported (48 in all). ``compare`` prints every key that differs: counts exactly, other keys by more
than 1e-12 (relative); keys only B has are named unless they are the ones ``--new`` lists (prefixes).
"""
from __future__ import annotations

import sys
import warnings

import numpy as np
import torch

from fuzz import as_dtype, corrupted_rows  # scripts/ is on sys.path when run as a script
from owa_metrics import OWAEventMetrics, VocabMap, build_tokenizer
from owa_metrics.events import simulate_session


def corpus(vocab, seed):
    """Six batches of (teacher-forcing preds, target, generated preds): corrupted rows, 10 % of ids replaced."""
    rng = np.random.default_rng(seed)
    events = simulate_session(duration_s=120, seed=seed, format=vocab.config.format)
    stream = [t for s in vocab.encode_sequences(events, 4096, ignore_images=True) for t in s]
    out = []
    for k in range(6):
        rows = corrupted_rows(rng, vocab, stream, 24)
        width = max(map(len, rows)) + 1
        target = as_dtype(rows, torch.int64, width)
        g = torch.Generator().manual_seed(seed * 100 + k)
        noise = torch.randint(0, vocab.size, target.shape, generator=g)
        preds = torch.where(torch.rand(target.shape, generator=g) < 0.1, noise, target.clamp(min=0))
        gen = torch.cat([preds[:, 3:], torch.full((preds.shape[0], 3), -100)], 1)  # shifted: generation-like
        out.append((preds, target, gen))
    return out


def reports():
    """{(format, alignment, pairing, mode, backend): the report as floats}."""
    out = {}
    for fmt in ("hierarchical", "factorized"):
        tok = build_tokenizer(format=fmt)
        vocab = VocabMap.from_tokenizer(tok)
        data = corpus(vocab, 1 if fmt == "hierarchical" else 2)
        for alignment, pairing in (("teacher_forcing", "index"), ("generation", "index"), ("generation", "time")):
            for mode in ("exact", "sketch"):
                for backend, tagged in ((b, t) for t in (False, True) for b in ("torch", "kernel")):
                    sliced = {"tags": ["a", "b", "c"], "tag_keys": "all", "bin_ms": 50} if tagged else {}
                    m = OWAEventMetrics(tok, alignment=alignment, pairing=pairing, mode=mode, backend=backend, **sliced)
                    for i, (preds, target, gen) in enumerate(data):
                        by_row = {"tags": torch.arange(len(target)) % 3} if tagged else {}
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            if alignment == "teacher_forcing":
                                logits = None
                                if i % 2:
                                    g = torch.Generator().manual_seed(i)
                                    logits = torch.randn(*target.shape, vocab.size, generator=g)
                                m.update(preds, target, logits=logits, **by_row)
                            else:
                                m.update(gen, target, **by_row)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        config = (fmt, alignment, pairing, mode, backend) + (("tags",) if tagged else ())
                        out[config] = {k: float(v) for k, v in m.compute().items()}
    return out


if __name__ == "__main__":
    if sys.argv[1] == "save":
        torch.save(reports(), sys.argv[2])
    else:
        NEW = sys.argv[sys.argv.index("--new") + 1:] if "--new" in sys.argv else []
        a, b = torch.load(sys.argv[2], weights_only=True), torch.load(sys.argv[3], weights_only=True)
        bad = 0
        for key in a:
            ra, rb = a[key], b[key]
            new = {k for k in set(rb) - set(ra) if any(p in k for p in NEW)}
            if set(ra) != set(rb) - new:
                print(key, "keys differ:", sorted(set(ra) ^ (set(rb) - new))); bad += 1
            for k in set(ra) & set(rb):
                x, y = ra[k], rb[k]
                is_count = k.startswith(("count/", "status/")) or k.endswith("/count")
                if (x != y) if is_count else abs(x - y) > 1e-12 * max(1, abs(x)):
                    print(key, k, x, y); bad += 1
        print("configs", len(a), "differences", bad)
