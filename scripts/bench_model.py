"""Issue 34's budget against a model: `OWAEventMetrics.update` (defaults) next to the forward pass of a
Qwen2-0.5B-sized causal LM (random weights, bf16, 8 x 2048 event-token ids), as a share of that forward.

    python scripts/bench_model.py [--repeats 20]        # on a CUDA GPU: the figures BENCHMARKS quotes
    python scripts/bench_model.py --tiny                # a 2-layer model on 2 x 512 ids, on this machine's device

Rows: the forward (``model(input_ids).logits``, inference mode); the update from the argmax ids; from the logits
(argmax and ``logits=``: what the Lightning callback reads by default); from the ids with ``token_loss=`` (the
per-token loss given, as the HF adapter's ``preprocess_logits_for_metrics`` makes it); from the ids with the D2E
bins (``bin_ms=50``, and 7 shifts); `compute()` after 5 updates. Each a median of ``--repeats``, from a synchronized
device to the end of its work. Budgets (issue 34): <= 2 % of the forward from the ids, <= 5 % with the logits.
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from owa_metrics import OWAEventMetrics, build_tokenizer
from owa_metrics.functional.tokens import per_token_loss

from bench_decode import make_batch, timed  # scripts/ is on sys.path when run as a script


def device_timed(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of ``fn`` from a synchronized device to the end of its work."""
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run():
        fn()
        wait()
    wait()
    return timed(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on 2 x 512 ids (the script itself)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = build_tokenizer()
    batch, seq_len = (2, 512) if args.tiny else (8, 2048)
    size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2) if args.tiny else dict(hidden_size=896, intermediate_size=4864,
                                                              num_hidden_layers=24, num_attention_heads=14,
                                                              num_key_value_heads=2)
    config = Qwen2Config(vocab_size=max(151_936, len(tokenizer)), tie_word_embeddings=True, **size)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    preds, target = (x.to(device) for x in make_batch(OWAEventMetrics(tokenizer).vocab, batch, seq_len))
    input_ids = target.clamp(min=0)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (1 thread)"
    print(f"torch {torch.__version__}, {name}; Qwen2 {params:.2f} B parameters (random, bf16), {batch} x {seq_len} "
          f"ids, V = {config.vocab_size}; tokenizer V = {len(tokenizer)}")
    with torch.inference_mode():
        logits = model(input_ids=input_ids).logits
        forward = device_timed(lambda: model(input_ids=input_ids), args.repeats, device)
        loss = per_token_loss(logits, target)
    rows = [("forward", forward)]
    cases = [("update from the ids", {}, lambda m: m.update(preds, target)),
             ("update from the logits (argmax + logits=)", {},
              lambda m: m.update(logits.argmax(-1), target, logits=logits)),
             ("update from the ids, token_loss=", {}, lambda m: m.update(preds, target, token_loss=loss)),
             ("update from the ids, bin_ms=50", {"bin_ms": 50}, lambda m: m.update(preds, target)),
             ("update from the ids, bin_ms=50, 7 shifts", {"bin_ms": 50, "bin_shifts": range(-3, 4)},
              lambda m: m.update(preds, target))]
    for label, options, update in cases:
        metric = OWAEventMetrics(tokenizer, **options).to(device)
        update(metric)
        rows.append((label, device_timed(lambda: update(metric), args.repeats, device)))
        if not options and "ids" in label and "loss" not in label:
            metric.reset()
            for _ in range(5):
                update(metric)
            rows.append(("compute() after 5 updates from the ids", device_timed(metric.compute, 3, device)))
    print(f"{'':45} {'ms':>8} {'share of the forward':>22}")
    for label, seconds in rows:
        print(f"{label:45} {seconds * 1e3:>8.2f} {seconds / forward:>21.1%}")


if __name__ == "__main__":
    main()
