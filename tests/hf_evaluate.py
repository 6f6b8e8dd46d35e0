"""transformers.Trainer.evaluate() with OWAEventMetricsForTrainer; run plain or under torch.distributed.run.

    python tests/hf_evaluate.py --out report.json
    python -m torch.distributed.run --nproc_per_node 2 tests/hf_evaluate.py --out report.json

Rank 0 writes the evaluation result. Used by tests/test_callbacks.py to compare 1 and 2 processes (the one process
is the test's own: ``main(["--out", path])``).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lightning_fixtures import TinyLM, collate, event_sequences, warm_up  # noqa: E402

from owa_metrics import VocabMap, build_tokenizer  # noqa: E402
from owa_metrics.callbacks import OWAEventMetricsForTrainer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    from transformers import Trainer, TrainingArguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    data = event_sequences(vocab, limit=14)  # 14 sequences: 7 per rank, batches of 3 -> the last one is short
    module = TinyLM(vocab.size, seed=0)
    warm_up(module, data)  # the same deterministic warm-up in every process
    adapter = OWAEventMetricsForTrainer(tokenizer)
    training = TrainingArguments(output_dir=str(Path(args.out).parent / "hf"), per_device_eval_batch_size=3,
                                 batch_eval_metrics=True, report_to="none", use_cpu=True)
    trainer = Trainer(model=module.model, args=training, eval_dataset=data, data_collator=collate,
                      compute_metrics=adapter, preprocess_logits_for_metrics=adapter.preprocess_logits_for_metrics)
    result = trainer.evaluate()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps({"report": result, "world": int(os.environ.get("WORLD_SIZE", "1"))}))


if __name__ == "__main__":
    main()
