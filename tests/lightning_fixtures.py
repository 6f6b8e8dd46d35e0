"""A tiny causal LM (GPT-2 config, random weights) and OWA event-token data for the callback tests."""

import lightning as L
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from owa_metrics import VocabMap
from owa_metrics.tokens import collate  # noqa: F401 - the tests' collate is the package's (the demo's, README's)
from owa_metrics.events import simulate_session
from conftest import SHARED_DATA, RECORDINGS


def event_sequences(vocab: VocabMap, max_tokens: int = 192, limit: int = 16, seed: int = 0):
    """Token-id sequences (ids, labels with image tokens as -100): the real recordings when ../shared is
    there, else the simulator."""
    if all((SHARED_DATA / name).exists() for name in RECORDINGS):
        from owa_metrics.events import read_recording

        events = [e for name in RECORDINGS for e in read_recording(SHARED_DATA / name)]
    else:
        events = simulate_session(60, seed=seed)
    ids = vocab.encode_sequences(events, max_tokens)[:limit]
    labels = vocab.encode_sequences(events, max_tokens, ignore_images=True)[:limit]
    return [{"input_ids": torch.tensor(i), "labels": torch.tensor(lab)} for i, lab in zip(ids, labels)]


def tiny_gpt2(vocab_size: int, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=2, eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(config)


def warm_up(module, data, steps: int = 30, lr: float = 1e-2) -> None:
    """Full-batch AdamW steps (deterministic on the CPU): enough for a share of well-formed predicted events."""
    batch = collate(data)
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr)
    for _ in range(steps):
        loss = module.model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


class TinyLM(L.LightningModule):
    """validation_step returns {'logits', 'labels'}; ``recorded`` keeps each epoch's logits and labels (test only)."""

    def __init__(self, vocab_size: int, lr: float = 3e-3, seed: int = 0):
        super().__init__()
        self.model = tiny_gpt2(vocab_size, seed)
        self.lr = lr
        self.recorded: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def on_validation_epoch_start(self):
        self.recorded.append([])

    def validation_step(self, batch, batch_idx):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        self.recorded[-1].append((out.logits.detach().cpu(), batch["labels"].cpu()))
        return {"logits": out.logits, "labels": batch["labels"]}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def report_of(logged: dict, prefix: str = "val/owa/", suffix: str = "") -> dict:
    """The report's keys and values among logged names: a headline key as ``{prefix}{key}``, every other key in a
    group of the prefix's parts joined by dots, "/", the key (``val.owa.timestamp/keyboard/timestamp/precision_p1``
    is ``keyboard/timestamp/precision_p1``); this reads those names back."""
    group = ".".join(part for part in prefix.split("/") if part)
    out = {}
    for name, value in logged.items():
        if not name.endswith(suffix):
            continue
        name = name[:len(name) - len(suffix)]
        if name.startswith(prefix):
            out[name[len(prefix):]] = value
        elif name.startswith(group + ".") and "/" in name:
            out[name.split("/", 1)[1]] = value
    return out


def reported(trainer) -> dict:
    """Every key the trainer's `OWAEventMetricsCallback` s reported in the last epoch (``callback.reported``: the
    headline keys are also in ``trainer.callback_metrics``, the others go to the loggers only)."""
    from owa_metrics.callbacks import OWAEventMetricsCallback

    return {k: v for c in trainer.callbacks if isinstance(c, OWAEventMetricsCallback) for k, v in c.reported.items()}
