"""The demo: train a tiny causal LM on OWA event tokens with Lightning and watch the event metrics learn.

``owa-metrics demo [--config configs/demo.yaml] [--epochs N] [--logger tensorboard|csv|wandb] [--mcap F ...]``
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch

from .events import read_recording, simulate_session
from .events.simulate import ACTIVITY_MIX
from .offline.evaluate import InputError, check_mcap
from .schema import Event
from .functional.report import WORDS, higher_is_better
from .report import format_number, unit_of
from .tokens.codec import FORMATS
from .tokens.data import collate, token_sequences
from .tokens.vocab import VocabMap, build_tokenizer


@dataclass
class DemoConfig:
    """Every setting of the demo; ``configs/demo.yaml`` holds the same keys."""

    seed: int = 0
    format: str = "hierarchical"  # the token format: hierarchical | factorized
    duration_s: float = 240.0  # simulated session length (ignored with mcap)
    screen_hz: float = 1.0
    mix: dict = field(default_factory=dict)  # activity weights of the simulator (move, type, click, scroll, pause)
    mcap: list = field(default_factory=list)  # real recordings instead of the simulator
    seq_len: int = 256
    val_fraction: float = 0.2  # the last part of every session, by time
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    epochs: int = 3
    batch_size: int = 8
    lr: float = 3e-3
    threads: int = 1  # torch intra-op threads: a tiny model trains faster on one, and a busy second core cannot stall it
    metric_mode: str = "exact"
    samples: int = 8
    logger: str = "tensorboard"
    out: str = "runs/demo"

    @classmethod
    def from_yaml(cls, path: str | Path) -> "DemoConfig":
        """The settings of a YAML file; `InputError` naming the file when it cannot be read or is not a mapping
        of known keys, and the file and the key when a value is not what the setting takes (`problem`)."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as err:
            raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
        except UnicodeDecodeError as err:
            raise InputError(f"{path}: not UTF-8 text (byte offset {err.start}); expected a YAML file") from None
        except yaml.YAMLError as err:
            where = getattr(err, "problem_mark", None)
            line = f" (line {where.line + 1})" if where is not None else ""
            raise InputError(f"{path}: not valid YAML{line}: {getattr(err, 'problem', None) or err}") from None
        except RecursionError:
            raise InputError(f"{path}: YAML nested too deep to read; expected a mapping of settings") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a mapping of settings, got a {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InputError(f"{path}: unknown keys {sorted(map(str, unknown))}; known: {sorted(known)}")
        config = cls(**data)
        problem = config.problem(data)
        if problem:
            raise InputError(f"{path}: {problem}")
        return config

    def problem(self, names=None) -> Optional[str]:
        """What is wrong with the settings ``names`` (default: all), as ``"key must be ..., got value"`` (`LIMITS`;
        ``n_head`` must split ``n_embd`` into heads of an even width: the rotary positions' pairs); None when
        nothing is."""
        for f in fields(self):
            test, words = LIMITS[f.name]
            if (names is None or f.name in names) and not test(getattr(self, f.name)):
                return f"{f.name} must be {words}, got {getattr(self, f.name)!r}"
        if (names is None or {"n_embd", "n_head"} & set(names)) and (self.n_embd % self.n_head or
                                                                     self.n_embd // self.n_head % 2):
            return (f"n_head must split n_embd into heads of an even width (n_embd / n_head: the rotary positions' "
                    f"pairs), got n_head {self.n_head} and n_embd {self.n_embd}")
        return None


def _number(test=lambda v: True, words: str = "a number") -> tuple:
    """A `LIMITS` row: a finite number (an int or a float, not a bool) that passes ``test``."""
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and test(v), words)


def _whole(low: int) -> tuple:
    """A `LIMITS` row: a whole number >= ``low`` (not a bool)."""
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low, f"a whole number >= {low}")


# what each demo setting must be: a test and its words
LIMITS = {
    "seed": _whole(0),
    "format": (lambda v: v in FORMATS, " or ".join(FORMATS)),
    "duration_s": _number(lambda v: v > 0, "a number of seconds > 0"),
    "screen_hz": _number(lambda v: v > 0, "a number > 0"),
    "mix": (lambda v: isinstance(v, dict) and all(k in ACTIVITY_MIX and _number(lambda w: w >= 0)[0](w)
                                                  for k, w in v.items()) and sum({**ACTIVITY_MIX, **v}.values()) > 0,
            f"a mapping of activity weights >= 0 ({', '.join(ACTIVITY_MIX)}), not all 0"),
    "mcap": (lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v), "a list of paths"),
    "seq_len": _whole(1),
    "val_fraction": _number(lambda v: 0 < v < 1, "a number in (0, 1)"),
    "n_layer": _whole(1),
    "n_embd": _whole(1),
    "n_head": _whole(1),
    "epochs": _whole(1),
    "batch_size": _whole(1),
    "lr": _number(lambda v: v > 0, "a number > 0"),
    "threads": _whole(1),
    "metric_mode": (lambda v: v in ("exact", "sketch"), "exact or sketch"),
    "samples": _whole(0),
    "logger": (lambda v: v in ("tensorboard", "csv", "wandb"), "tensorboard, csv or wandb"),
    "out": (lambda v: isinstance(v, str) and v != "" and not os.path.isfile(v), "a folder's path (not a file's)"),
}


def split_by_time(events: list[Event], val_fraction: float) -> tuple[list[Event], list[Event]]:
    """The first (1 - val_fraction) of the session's time span trains, the rest validates."""
    if not events:
        return [], []
    start, end = events[0].timestamp_ns, events[-1].timestamp_ns
    cut = start + (end - start) * (1 - val_fraction)
    return [e for e in events if e.timestamp_ns < cut], [e for e in events if e.timestamp_ns >= cut]


def load_sessions(config: DemoConfig) -> list[list[Event]]:
    if config.mcap:
        return [read_recording(path, format=config.format) for path in config.mcap]
    return [simulate_session(config.duration_s, seed=config.seed, screen_hz=config.screen_hz, format=config.format,
                             mix=config.mix)]


def build_data(config: DemoConfig, vocab: VocabMap, where: str = ""):
    """Train / validation token sequences (inputs with image tokens, labels with them as -100); `InputError` naming
    the setting (after ``where``, e.g. the config file) when an event is longer than ``seq_len`` or a split is
    empty."""
    splits = {"train": [], "val": []}
    for events in load_sessions(config):
        for name, part in zip(("train", "val"), split_by_time(events, config.val_fraction)):
            try:
                splits[name] += token_sequences(vocab, part, config.seq_len)
            except ValueError as err:  # an event longer than the sequences
                raise InputError(f"{where}seq_len: {err}; raise seq_len") from None
    if not splits["train"] or not splits["val"]:
        raise InputError(f"{where}duration_s: not enough events for a train and a validation split: use a longer "
                         "session (or more recordings)")
    return splits["train"], splits["val"]


def demo_model(config: DemoConfig, vocab_size: int, pad_id: int, eos_id: int):
    """A Llama-style causal LM of ``config``'s size with random weights (rotary positions let it learn "as the
    previous event" within seconds), as a LightningModule whose validation_step returns the logits and labels the
    callback reads."""
    import lightning as L
    from transformers import LlamaConfig, LlamaForCausalLM

    class _DemoModel(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = LlamaForCausalLM(LlamaConfig(
                vocab_size=vocab_size, hidden_size=config.n_embd, intermediate_size=4 * config.n_embd,
                num_hidden_layers=config.n_layer, num_attention_heads=config.n_head, num_key_value_heads=config.n_head,
                max_position_embeddings=config.seq_len, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id))

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            # the progress bar's only: TensorBoard opens the first two groups by name, Lightning's `epoch` and this
            # run's headline group `val` (val/loss and the event metrics)
            self.log("train/loss", loss, prog_bar=True, logger=False)
            return loss

        def validation_step(self, batch, batch_idx):
            out = self.model(**batch)
            self.log("val/loss", out.loss, prog_bar=True)
            return {"logits": out.logits, "labels": batch["labels"]}

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=config.lr)

    return _DemoModel()


def run_demo(config: DemoConfig, where: str = "") -> dict:
    """Train, log, and return ``{"log_dir", "first", "last"}`` (the first and last epoch's reports). Raises
    `InputError` naming the setting that is wrong (after ``where``: the config file's name in messages)."""
    import lightning as L

    from .callbacks import OWAEventMetricsCallback

    problem = config.problem()
    if problem:
        raise InputError(f"{where}{problem}")
    torch.set_num_threads(config.threads)
    L.seed_everything(config.seed, verbose=False)
    tokenizer = build_tokenizer(format=config.format)
    vocab = VocabMap.from_tokenizer(tokenizer)
    train, val = build_data(config, vocab, where)

    out = Path(config.out)
    logger = _logger(config.logger, out)
    callback = OWAEventMetricsCallback(tokenizer, mode=config.metric_mode, samples=config.samples)
    model = demo_model(config, vocab.size, tokenizer.pad_token_id, tokenizer.eos_token_id)
    trainer = L.Trainer(max_epochs=config.epochs, accelerator="cpu", devices=1, logger=logger, callbacks=[callback],
                        enable_checkpointing=False, default_root_dir=out, log_every_n_steps=5,
                        num_sanity_val_steps=0)
    loader = torch.utils.data.DataLoader
    trainer.fit(model, loader(train, batch_size=config.batch_size, shuffle=True, collate_fn=collate),
                loader(val, batch_size=config.batch_size, collate_fn=collate))
    log_dir = Path(trainer.log_dir or out)
    reports = sorted((json.loads(p.read_text()) for p in (log_dir / "owa_metrics" / "val" / "owa").glob("*.json")),
                     key=lambda report: (report["epoch"], report["step"]))
    first, last = reports[0], reports[-1]
    return {"log_dir": str(log_dir), "first": first, "last": last, "config": asdict(config)}


def _logger(kind: str, out: Path):
    from lightning.pytorch import loggers

    if kind == "tensorboard":
        return loggers.TensorBoardLogger(out, name="tensorboard")
    if kind == "csv":
        return loggers.CSVLogger(out, name="csv")
    if kind == "wandb":
        # offline unless WANDB_MODE says otherwise (the demo needs no account; WANDB_MODE=online logs to the server)
        return loggers.WandbLogger(save_dir=str(out), project="owa-metrics-demo", offline="WANDB_MODE" not in os.environ)
    raise ValueError(f"--logger must be tensorboard, csv or wandb, got {kind!r}")


# what a tiny model learns in a few epochs, and what the metrics show of it; each key's words, unit and direction are
# the report's (`WORDS`, `unit_of`, `higher_is_better`)
COMPARED = ("comparable_rate", "category/macro_f1", "timestamp/abs_error_p95_ms", "token_accuracy/timestamp",
            "mouse/direction_error_p50_deg", "mouse/euclidean_iqmpe_pct", "mouse_nop/loss", "keyboard/loss")


def summary(result: dict, logger: str) -> str:
    """Where the logs are, how to look at them, and the first epoch next to the last, each row's key last."""
    first, last = result["first"], result["last"]
    lines = [f"logs: {result['log_dir']}"]
    if logger == "tensorboard":
        lines.append(f"open: tensorboard --logdir {Path(result['log_dir']).parent}")
    one = first["epoch"] == last["epoch"]  # one epoch: its column alone, nothing to compare
    epochs = "".join(f" {'epoch ' + str(report['epoch']):>9}" for report in ((last,) if one else (first, last)))
    width = max(len(WORDS[key]) for key in COMPARED)
    lines += ["", f"{'metric':<{width}}  {'unit':<5}{epochs}  {'' if one else 'better  '}key"]
    for key in COMPARED:
        a, b, unit, higher = first.get(key), last.get(key), unit_of(key), higher_is_better(key)
        better = "" if a is None or b is None else ("yes" if (b > a) == higher and a != b else "no")
        values = "".join(f" {format_number(x, unit):>9}" for x in ((b,) if one else (a, b)))
        lines.append(f"{WORDS[key]:<{width}}  {unit:<5}{values}  {'' if one else f'{better:<6}  '}{key}")
    return "\n".join(lines)


def main(config_path: Optional[str], epochs: Optional[int], logger: Optional[str], mcap: Optional[list],
         out: Optional[str], format: Optional[str] = None) -> int:
    config = DemoConfig.from_yaml(config_path) if config_path else DemoConfig()
    given = {name: value for name, value in (("epochs", epochs), ("logger", logger), ("mcap", mcap), ("out", out),
                                             ("format", format)) if value is not None}
    for name, value in given.items():  # the flags override the file
        setattr(config, name, [str(p) for p in value] if name == "mcap" else value)
    problem = config.problem(given)
    if problem:
        raise InputError(f"--{problem}")
    for path in config.mcap or ():
        check_mcap(Path(path))
    result = run_demo(config, f"{config_path}: " if config_path else "")
    print(summary(result, config.logger))
    return 0
