"""Trainer.validate with the callback on N CPU processes (strategy "ddp"); rank 0 writes what was logged.

    python tests/ddp_validate.py --devices 2 --out report.json

Run by tests/test_callbacks.py; Lightning's DDP launcher starts the other ranks by re-running this script.
Keyboard events only sit in even-indexed sequences, which the validation DistributedSampler gives to rank 0,
so rank 1 sees none of that category.
"""

import argparse
import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lightning_fixtures import TinyLM, collate, event_sequences, warm_up  # noqa: E402

from owa_metrics import VocabMap, build_tokenizer  # noqa: E402
from owa_metrics.callbacks import OWAEventMetricsCallback  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    data = event_sequences(vocab, limit=1000)
    keyboard = vocab.ids["<KEYBOARD>"]
    with_keys = [x for x in data if (x["input_ids"] == keyboard).any()]
    without = [x for x in data if not (x["input_ids"] == keyboard).any()]
    n = min(len(with_keys), len(without), 6)
    ordered = [x for pair in zip(with_keys[:n], without[:n]) for x in pair]  # even: with keys, odd: without

    module = TinyLM(vocab.size, seed=0)
    warm_up(module, ordered, steps=40)  # the same deterministic warm-up in every process

    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[OWAEventMetricsCallback(tokenizer, artifacts=False)])
    trainer.validate(module, DataLoader(ordered, batch_size=3, collate_fn=collate))
    if trainer.global_rank == 0:
        report = {k: float(v) for k, v in trainer.callback_metrics.items()}
        Path(args.out).write_text(json.dumps({"report": report, "sequences": len(ordered)}))


if __name__ == "__main__":
    main()
