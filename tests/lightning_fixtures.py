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
    """The report's keys and values among logged names. Every key is logged in its area's group: the prefix's and
    the key's parts but the last joined by dots, "/", the last part (``val.owa.keyboard.timestamp/precision_p1`` is
    ``keyboard/timestamp/precision_p1``); this reads those names back."""
    group = ".".join(part for part in prefix.split("/") if part)
    out = {}
    for name, value in logged.items():
        if name.startswith(group) and name[len(group):len(group) + 1] in (".", "/") and name.endswith(suffix):
            head, _, last = name[len(group) + 1:len(name) - len(suffix)].rpartition("/")
            out[f"{head.replace('.', '/')}/{last}" if head else last] = value
    return out
