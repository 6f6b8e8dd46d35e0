"""Trainer.fit with two callbacks at their defaults (teacher forcing, and generation under its own prefix), the
TensorBoard and CSV loggers, on N CPU processes; the model does not learn (lr 0), so every process count must log
the same values. Keyboard events only sit in even-indexed sequences, which the validation DistributedSampler gives
to rank 0, so rank 1 sees none of that category. 7 sequences on 2 ranks: the sampler pads rank 1 with sequence 0
(keyboard events), which the callbacks must drop to count each sequence once; generation asks for more sequences than
there are.

    python tests/ddp_fit.py --devices 2 --strategy ddp --out DIR [--tags]

Run by tests/test_callbacks.py (one process: `run` in the test's own); with strategy "ddp" Lightning starts the
other ranks by re-running this script. A hang fails within the process group's timeout. ``--tags``: both callbacks
with `TAGS` (each sequence tagged in turn) and ``tag_keys="all"``, generation paired by time over a tolerance sweep:
some 700 keys per epoch; the main process then writes ``trainer.callback_metrics``' names to ``callback_metrics.json``
and every callback's ``reported`` (name: value) to ``reported.json`` (under ddp_spawn: what the spawned ranks left).
"""

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lightning_fixtures import TinyLM, collate, event_sequences, reported, warm_up  # noqa: E402

from owa_metrics import VocabMap, build_tokenizer  # noqa: E402
from owa_metrics.callbacks import OWAEventMetricsCallback  # noqa: E402

SEQUENCES = 7  # odd: Lightning's DistributedSampler pads 2 ranks with a repeated sequence
GENERATED = 8  # max_sequences of the generation callback: every sequence
TAGS = ["game", "editor", "browser", "terminal"]
SWEEP_MS = (50, 100, 200, 500)


def sequences(vocab: VocabMap) -> list[dict]:
    """`SEQUENCES` sequences: even-indexed ones with keyboard events, odd-indexed ones without."""
    data = event_sequences(vocab, limit=1000)
    keyboard = vocab.ids["<KEYBOARD>"]
    with_keys = [x for x in data if (x["input_ids"] == keyboard).any()]
    without = [x for x in data if not (x["input_ids"] == keyboard).any()]
    n = (SEQUENCES + 1) // 2
    assert len(with_keys) >= n and len(without) >= n
    return [x for pair in zip(with_keys[:n], without[:n]) for x in pair][:SEQUENCES]


def run(devices: int, strategy: str, out: Path, tags: bool = False) -> None:
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    data = sequences(vocab)
    if tags:
        data = [{**x, "tag": TAGS[i % len(TAGS)]} for i, x in enumerate(data)]
    module = TinyLM(vocab.size, lr=0.0, seed=0)
    warm_up(module, data, steps=40)  # the same deterministic warm-up in every process

    strategy = "auto" if devices == 1 else DDPStrategy(start_method="popen" if strategy == "ddp" else "spawn",
                                                        timeout=timedelta(seconds=60))
    sliced = {"tags": TAGS, "tag_keys": "all"} if tags else {}
    swept = {"pairing": "time", "tolerance_ms": SWEEP_MS} if tags else {}
    callbacks = [OWAEventMetricsCallback(tokenizer, **sliced),
                 OWAEventMetricsCallback(tokenizer, alignment="generation", prefix="val/owa_gen/",
                                         max_sequences=GENERATED, predict_events=2, max_new_tokens=40, **sliced, **swept)]
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=devices, strategy=strategy,
                        logger=[CSVLogger(out, name="csv"), TensorBoardLogger(out, name="tb")], callbacks=callbacks,
                        limit_train_batches=1, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=out)
    loader = DataLoader(data, batch_size=2, collate_fn=collate)
    trainer.fit(module, loader, loader)
    if tags:
        (out / "callback_metrics.json").write_text(json.dumps(sorted(trainer.callback_metrics)))
        (out / "reported.json").write_text(json.dumps({k: float(v) for k, v in reported(trainer).items()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tags", action="store_true")
    args = parser.parse_args()
    run(args.devices, args.strategy, Path(args.out), args.tags)


if __name__ == "__main__":
    main()
