import csv
import json
import math
import re
import time
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

from owa_metrics import OWAEventMetrics, align_teacher_forcing
from owa_metrics.callbacks import OWAEventMetricsCallback
from owa_metrics.report import unit_of
from lightning_fixtures import TinyLM, collate, event_sequences, report_of, reported, warm_up
from oracles import close

HEADLINE = ["comparable_rate", "category/macro_f1", "keyboard/ratio", "screen/comparable_rate",
            "token_accuracy/timestamp", "mouse_nop/loss", "count/target_events", "status/valid"]
# the charts TensorBoard shows first under teacher forcing (logged as val/owa/{key}): the headline of the report
# without the keys that tiny true moves dominate (mouse/euclidean_pe_p95_pct, mouse/r2)
TF_HEADLINE = ["comparable_rate", "category/macro_f1", "timestamp/abs_error_p95_ms", "timestamp/signed_error_iqm_ms",
               "mouse/euclidean_iqmpe_pct", "mouse/direction_error_p50_deg", "mouse/direction_error_p95_deg",
               "mouse/action_accuracy", "keyboard/accuracy", "token_accuracy/timestamp"]
# constants under teacher forcing (one prediction per target event): logged in generation only
GENERATION_ONLY = ["count_accuracy", "count/pred_events", "count/extra_events", "count/missing_events", "status/missing"]


def _trainer(tmp_path, callback, logger, epochs=2, **kwargs):
    return L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=logger, callbacks=[callback],
                     enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                     default_root_dir=tmp_path, num_sanity_val_steps=1, **kwargs)


def _loaders(vocab, batch_size=4):
    data = event_sequences(vocab)
    load = partial(DataLoader, batch_size=batch_size, collate_fn=collate)
    return load(data, shuffle=True), load(data)


def _by_hand(tokenizer, recorded):
    """OWAEventMetrics run by hand on what validation_step saw (HF shift, logits for the loss)."""
    metric = OWAEventMetrics(tokenizer)
    for logits, labels in recorded:
        preds, target = align_teacher_forcing(logits, labels)
        metric.update(preds, target, logits=logits[:, :-1])
    return {k: float(v) for k, v in metric.compute().items()}


@pytest.fixture(scope="module")
def warm_state(vocab):
    """Weights after 30 full-batch steps: enough for a share of well-formed predicted events."""
    module = TinyLM(vocab.size)
    warm_up(module, event_sequences(vocab))
    return module.state_dict()


def test_fit_logs_the_report_to_tensorboard(tmp_path, tokenizer, vocab, warm_state):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    callback = OWAEventMetricsCallback(tokenizer)
    logger = TensorBoardLogger(tmp_path, name="tb")
    train, val = _loaders(vocab)
    _trainer(tmp_path, callback, logger).fit(module, train, val)

    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert len(module.recorded) == 3  # the sanity check, then two epochs
    by_hand = [_by_hand(tokenizer, module.recorded[epoch + 1]) for epoch in range(2)]
    logged = report_of({tag: events.Scalars(tag) for tag in tags["scalars"]})
    for key in HEADLINE:
        assert len(logged[key]) == 2, key  # both epochs, nothing from the sanity check
    for epoch, step in enumerate((3, 7)):  # every logged value equals the metric run by hand on the same predictions
        at = {key: next((p.value for p in points if p.step == step), None) for key, points in logged.items()}
        for key, value in by_hand[epoch].items():
            if unit_of(key) == "count" and all(by_hand[e].get(key) == 0 for e in range(epoch + 1)):
                assert at.get(key) is None, key  # a count that has been zero all along is no chart (files have it)
            else:
                assert close(at[key], value, 1e-5), (key, epoch)
    # the headline charts as val/owa/{key} (equal to their area's), a handful; nothing that cannot apply
    headline = {tag for tag in tags["scalars"] if tag.startswith("val/owa/")}
    assert headline == {f"val/owa/{key}" for key in TF_HEADLINE if key in by_hand[0] or key in by_hand[1]}
    assert 5 <= len(headline) <= 12 and not {"val/owa/mouse/r2", "val/owa/mouse/euclidean_pe_p95_pct"} & headline
    for tag in headline:
        assert [p.value for p in events.Scalars(tag)] == [p.value for p in logged[tag[len("val/owa/"):]]], tag
    assert {"val.owa.timestamp/timestamp/precision_p1", "val.owa.timestamp/mouse_nop/timestamp/iqmpe_pct"} <= set(
        tags["scalars"])
    groups = {tag.split("/", 1)[0] for tag in tags["scalars"]}  # a few groups, not one per key family
    assert {"epoch", "val", "val.owa.events", "val.owa.timestamp", "val.owa.tokens"} <= groups <= {
        "epoch", "val", *(f"val.owa.{s}" for s in ("events", "timestamp", "tokens", "mouse", "keyboard"))}, groups
    assert not set(GENERATION_ONLY) & set(logged)
    assert "val/owa/timestamp/signed_error_ms" in tags["histograms"]
    assert "val/owa/category_confusion" in tags["images"]
    assert any(tag.startswith("val/owa/samples") for tag in tags["tensors"])
    folder = tmp_path / "tb" / "version_0" / "owa_metrics" / "val" / "owa"
    artifact = json.loads((folder / "epoch_1_step_7.json").read_text())
    assert close(artifact["comparable_rate"], _by_hand(tokenizer, module.recorded[2])["comparable_rate"])
    report = (folder / "epoch_1_step_7.md").read_text()
    assert "| keyboard |" in report and "## Samples" in report
    _assert_report_parses_back(report, artifact)

    steps = [3, 7]  # 4 training batches an epoch: Lightning logs the epoch's scalars at batches stepped - 1
    headline_steps = [p.step for p in events.Scalars("val/owa/comparable_rate")]
    assert [p.step for p in logged["comparable_rate"]] == headline_steps == steps
    assert [e.step for e in events.Histograms("val/owa/timestamp/signed_error_ms")] == steps
    assert [e.step for e in events.Images("val/owa/category_confusion")] == steps
    assert [e.step for e in events.Tensors("val/owa/samples")] == steps
    # the histograms' ranges as text beside them (TensorBoard's default loader shows no tag description)
    ranges = events.Tensors("val/owa/histogram_ranges")[-1].tensor_proto.string_val[0].decode()
    row = next(line for line in ranges.splitlines() if line.startswith("| timestamp/signed_error_ms |"))
    low, high = (float(cell.split()[0].replace(",", "")) for cell in row.strip("|").split("|")[1:3])
    histogram = events.Histograms("val/owa/timestamp/signed_error_ms")[-1].histogram_value
    assert close(low, histogram.min, 1e-3) and close(high, histogram.max, 1e-3) and "Tukey" in ranges
    assert [e.step for e in events.Tensors("val/owa/histogram_ranges")] == steps
    assert [json.loads((folder / f"epoch_{e}_step_{s}.json").read_text())["step"] for e, s in enumerate(steps)] == steps
    assert sorted(p.name for p in folder.iterdir()) == [f"epoch_{e}_step_{s}{x}" for e, s in enumerate(steps)
                                                        for x in (".json", ".md", "_timeline_0.png", "_timeline_1.png")]
    # the timelines of the first two sequences each epoch (a default): TensorBoard images, the PNG files' bytes
    for i in range(2):
        images = events.Images(f"val/owa/timeline_{i}")
        assert [e.step for e in images] == steps
        assert images[-1].encoded_image_string == (folder / f"epoch_1_step_7_timeline_{i}.png").read_bytes()
        assert images[-1].width >= 600 and images[-1].height >= 200
    # the Custom Scalars tab: the headline's charts, as logged
    from tensorboard.plugins.custom_scalar import layout_pb2

    layout = layout_pb2.Layout.FromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for category in layout.category for c in category.chart}
    assert charts["comparable events (ratio)"] == [re.escape("val/owa/comparable_rate")]
    assert sorted(re.sub(r"\\(.)", r"\1", t) for tags in charts.values() for t in tags) == sorted(headline)


HEADLINE_KEYS = {"comparable events": "comparable_rate", "category macro F1": "category/macro_f1",
                 "timestamp abs error P95": "timestamp/abs_error_p95_ms",
                 "timestamp signed error IQM": "timestamp/signed_error_iqm_ms",
                 "mouse euclidean error IQM": "mouse/euclidean_iqmpe_pct",
                 "mouse euclidean error P95": "mouse/euclidean_pe_p95_pct",
                 "mouse direction error P50": "mouse/direction_error_p50_deg",
                 "mouse direction error P95": "mouse/direction_error_p95_deg",
                 "mouse button accuracy": "mouse/action_accuracy", "keyboard accuracy (vk and action)": "keyboard/accuracy",
                 "timestamp tokens right": "token_accuracy/timestamp"}
UNIT_DECIMALS = {"ratio": 4, "ms": 1, "%": 1, "deg": 1}


def _table(markdown: str, first_header: str) -> list[list[str]]:
    """The rows (header first) of the markdown table whose first header cell is ``first_header``."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return [rows[0]] + rows[2:]  # without the alignment row


def _decimals(cell: str) -> int:
    return len(cell.split(".")[1]) if "." in cell else 0


def _assert_report_parses_back(markdown: str, values: dict) -> None:
    """Every number of the epoch's markdown equals the JSON's to its printed digits, one format per column."""
    headline = _table(markdown, "metric")[1:]
    assert {name for name, _, _ in headline} == {n for n, k in HEADLINE_KEYS.items() if k in values}
    assert "count_accuracy" not in values and "event count right" not in markdown  # generation only
    for name, cell, unit in headline:
        assert _decimals(cell) == UNIT_DECIMALS[unit], (name, cell)
        assert abs(float(cell.replace(",", "")) - values[HEADLINE_KEYS[name]]) <= 0.5 * 10 ** -_decimals(cell) + 1e-9
    header, *rows = _table(markdown, "category")
    assert [r[0] for r in rows] == ["keyboard", "mouse_op", "mouse_nop", "screen"] and "loss" in header
    for j, column in enumerate(header[1:], 1):
        printed = [r[j] for r in rows if r[j] != "–"]
        assert printed and len({_decimals(c) for c in printed}) == 1, column  # one number format per column
        for category, *cells in rows:
            key, cell = f"{category}/{column}", cells[j - 1]
            if cell == "–":
                assert key not in values, key
            else:
                assert abs(float(cell.replace(",", "")) - values[key]) <= 0.5 * 10 ** -_decimals(cell) + 1e-9, key


def test_csv_logger_gets_scalars_only_and_a_resumed_callback_keeps_its_own_settings(tmp_path, tokenizer, vocab,
                                                                                     warm_state, caplog):
    callback = OWAEventMetricsCallback(tokenizer, mode="sketch", prefix="v/", samples=0)
    train, val = _loaders(vocab)
    trainer = _trainer(tmp_path, callback, CSVLogger(tmp_path, name="csv"), epochs=1)
    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    trainer.fit(module, train, val)
    header = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "v/comparable_rate" in header and "v/mouse/direction_error_p95_deg" in header and "v.mouse/mouse/r2" in header
    assert (tmp_path / "csv" / "version_0" / "owa_metrics" / "v" / "epoch_0_step_3.json").exists()
    restored = OWAEventMetricsCallback(tokenizer)
    with caplog.at_level("INFO"):
        restored.load_state_dict(callback.state_dict())
    assert (restored.mode, restored.prefix, restored.samples, restored.metric.mode) == ("exact", "val/owa/", 8, "exact")
    said = [r.getMessage() for r in caplog.records if "checkpoint's" in r.getMessage()]
    assert len(said) == 1 and "mode='exact' (checkpoint: 'sketch')" in said[0] and "prefix='val/owa/'" in said[0]


@pytest.mark.parametrize("returned", [None, "loss tensor", "dict without logits"])
def test_missing_outputs_raise_saying_what_validation_step_must_return(tmp_path, tokenizer, vocab, returned):
    class Silent(TinyLM):
        def validation_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            self.log("val_loss", loss)
            return {None: None, "loss tensor": loss, "dict without logits": {"loss": loss}}[returned]

    train, val = _loaders(vocab)
    trainer = _trainer(tmp_path, OWAEventMetricsCallback(tokenizer), False, epochs=1)
    with pytest.raises(RuntimeError, match=r"cannot find predictions and labels \(validation_step returned .*"
                                           r"validation_step must return a dict with 'logits'"):
        trainer.fit(Silent(vocab.size), train, val)
    assert trainer.global_step == 0  # stopped in the sanity check, before any training step


def test_a_failing_generate_fn_is_named_with_its_batch(tmp_path, tokenizer, vocab):
    def broken(input_ids, attention_mask, max_new_tokens):
        raise ValueError("out of memory, say")

    _, val = _loaders(vocab)
    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", generate_fn=broken)
    with pytest.raises(RuntimeError, match=r"generate_fn failed at validation batch 0 \(ValueError: out of memory, "
                                           r"say\)\. generate_fn\(input_ids, attention_mask, max_new_tokens\) must"):
        _trainer(tmp_path, callback, False, epochs=1).validate(TinyLM(vocab.size), val)
    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", generate_fn=lambda *args: "text")
    with pytest.raises(RuntimeError, match=r"batch 0 \(TypeError: got str\)"):
        _trainer(tmp_path, callback, False, epochs=1).validate(TinyLM(vocab.size), val)


def test_generation_mode_counts_and_survives_garbage(tmp_path, tokenizer, vocab):
    _, val = _loaders(vocab)

    sequences = [x["input_ids"].tolist() for x in event_sequences(vocab)]

    def oracle_generate(input_ids, attention_mask, max_new_tokens):
        """A perfect model: continues each prompt with the true remaining events."""
        rows = []
        for prompt, mask in zip(input_ids, attention_mask):
            kept = prompt[mask.bool()].tolist()
            full = next(s for s in sequences if s[:len(kept)] == kept)
            rows.append(prompt.tolist() + full[len(kept):])
        width = max(map(len, rows))
        return torch.tensor([r + [0] * (width - len(r)) for r in rows])

    logs = {}
    def oracle_lists(input_ids, attention_mask, max_new_tokens):  # the same, as ragged lists (right padding cut)
        rows = oracle_generate(input_ids, attention_mask, max_new_tokens).tolist()
        return [row[:max(i + 1 for i, t in enumerate(row) if t != 0)] for row in rows]

    for name, generate_fn in (("perfect", oracle_generate), ("lists", oracle_lists), ("random", None)):
        callback = OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=3, max_sequences=6,
                                           generate_fn=generate_fn, max_new_tokens=120, generated_screens="scored")
        trainer = _trainer(tmp_path / name, callback, CSVLogger(tmp_path / name), epochs=1)
        trainer.validate(TinyLM(vocab.size), val)
        logs[name] = {k: float(v) for k, v in reported(trainer).items()}
    perfect, garbage = logs["perfect"], logs["random"]
    assert logs["lists"] == perfect
    starts = [int((x["input_ids"] == vocab.ids["<EVENT_START>"]).sum()) for x in event_sequences(vocab)[:6]]
    expected = sum(n - max(n - 3, 1) for n in starts)  # the last 3 events, at least one kept as prompt
    assert perfect["val/owa/comparable_rate"] == 1.0 and perfect["val/owa/count_accuracy"] == 1.0  # headline charts
    perfect, garbage = report_of(perfect), report_of(garbage)
    assert perfect["count/target_events"] == expected > 0 and perfect["count_accuracy"] == 1.0
    assert garbage["count/target_events"] == expected and garbage["status/valid"] < expected
    assert garbage.get("comparable_rate", 0.0) < 0.5
    assert set(GENERATION_ONLY) <= set(garbage) and set(GENERATION_ONLY) <= set(perfect)  # they apply here


def test_callback_holds_no_logits_across_batches(tmp_path, tokenizer, vocab):
    """State bytes after every batch are the same for a 272-token and a 20,000-token vocabulary."""

    class Probe(L.Callback):
        def __init__(self, watched):
            self.watched, self.bytes = watched, []

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            tensors = [t for _, s in self.watched.metric.metric_state.items() for t in (s if isinstance(s, list) else [s])]
            tensors += [t for run in self.watched._runs.values() for pair in run.kept for t in pair]
            self.bytes.append(sum(t.numel() * t.element_size() for t in tensors))

    class FixedLogits(L.LightningModule):
        def __init__(self, vocab_size):
            super().__init__()
            self.vocab_size, self.anchor = vocab_size, torch.nn.Parameter(torch.zeros(1))

        def validation_step(self, batch, batch_idx):
            logits = torch.nn.functional.one_hot(batch["input_ids"].roll(-1, 1), self.vocab_size).float()
            return {"logits": logits, "labels": batch["labels"]}

    _, val = _loaders(vocab, batch_size=2)
    sizes = []
    for vocab_size in (vocab.size, 20_000):
        callback = OWAEventMetricsCallback(tokenizer, histograms=False, confusion_figure=False, artifacts=False)
        probe = Probe(callback)
        L.Trainer(accelerator="cpu", logger=False, callbacks=[callback, probe], enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=tmp_path).validate(FixedLogits(vocab_size), val)
        sizes.append(probe.bytes)
    assert len(sizes[0]) == len(val) and sizes[0] == sizes[1]
    assert math.isclose(sizes[0][-1], sizes[0][-1])


def test_the_demo_logs_to_wandb_as_wandb_mode_says(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is the optional 'wandb' extra")
    import wandb

    from owa_metrics.demo import _logger

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _logger("wandb", tmp_path / "a").experiment.settings.mode == "disabled"
    wandb.finish()
    wandb.teardown()  # W&B reads the environment once per process setup
    monkeypatch.delenv("WANDB_MODE")
    assert _logger("wandb", tmp_path / "b").experiment.settings.mode in ("offline", "dryrun")  # no account needed
    wandb.finish()
    wandb.teardown()


def _at_step(rows: list[dict], row: dict) -> dict:
    """Every history row of ``row``'s step merged (the headline and the breakdowns are logged apart)."""
    return {k: v for r in rows if r.get("trainer/global_step") == row["trainer/global_step"] for k, v in r.items()}


def _wandb_history(run_dir):
    """History rows of an offline W&B run, read from its .wandb file (LevelDB-style log of protobuf records): the
    complete records only (W&B's service may still be writing the end of the file)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw = next(run_dir.glob("*.wandb")).read_bytes()
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind not in (1, 2, 3, 4) or pos + 7 + length > len(raw):  # not written yet
            break
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + data)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        else:
            pending += data
    return rows


def test_fit_logs_to_wandb_offline(tmp_path, tokenizer, vocab, warm_state, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="W&B is the optional 'wandb' extra")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="owa-metrics-test")
    train, val = _loaders(vocab)
    _trainer(tmp_path, OWAEventMetricsCallback(tokenizer), logger).fit(module, train, val)
    wandb.finish()
    run = next((tmp_path / "wandb").glob("offline-run-*"))
    for _ in range(100):  # W&B's service writes the file after finish() returns: wait up to 10 s for both epochs
        rows = _wandb_history(run)
        scalars = [r for r in rows if "val/owa/comparable_rate" in r]
        if len(scalars) >= 2 and sum("val/owa/samples/_type" in r for r in rows) >= 2:
            break
        time.sleep(0.1)
    assert len(scalars) == 2
    for epoch, row in enumerate(scalars):
        by_hand = _by_hand(tokenizer, module.recorded[epoch + 1])
        for key in HEADLINE:
            assert close(report_of(_at_step(rows, row))[key], by_hand[key], 1e-5), (key, epoch)
    extras = {k for r in rows for k in r}
    assert {"val/owa/timestamp/signed_error_ms/_type", "val/owa/category_confusion/_type",
            "val/owa/samples/_type", "val/owa/timeline_0/_type", "val/owa/timeline_1/_type"} <= extras
    extra_steps = [r["trainer/global_step"] for r in rows if "val/owa/samples/_type" in r]
    assert [r["trainer/global_step"] for r in scalars] == extra_steps == [3, 7]  # one step per epoch's artifacts
    table = json.loads(next((tmp_path / "wandb").glob("offline-run-*/files/media/table/**/*.table.json")).read_text())
    assert table["columns"][:2] == ["seq", "event"] and table["data"][0][:2] == [0, 0]  # numbers, not text
    files = next((tmp_path / "wandb").glob("offline-run-*")) / "files" / "owa_metrics" / "val" / "owa"
    report = json.loads((files / "epoch_1_step_7.json").read_text())  # the reports are the run's files
    assert close(report["comparable_rate"], scalars[1]["val/owa/comparable_rate"], 1e-6)
    assert sorted(p.name for p in files.iterdir()) == [f"epoch_{e}_step_{s}{x}" for e, s in enumerate((3, 7))
                                                       for x in (".json", ".md", "_timeline_0.png", "_timeline_1.png")]
    images = [r for r in rows if "val/owa/timeline_0/_type" in r]
    assert [r["trainer/global_step"] for r in images] == [3, 7] and images[0]["val/owa/timeline_0/_type"] == "image-file"


def _csv_row(out):
    """The CSV logger's validation rows (rank zero's file; the headline and the breakdowns are logged apart) as
    {key: value}."""
    import csv

    rows = list(csv.DictReader((out / "csv" / "version_0" / "metrics.csv").open()))
    step = next(r for r in rows if r.get("val/owa/comparable_rate"))["step"]
    return {k: float(v) for r in rows if r["step"] == step for k, v in r.items() if k.startswith("val") and v != ""}


@pytest.fixture(scope="module")
def one_process_fit(tmp_path_factory):
    """ddp_fit's run in one process (this one), the logged row the DDP runs must equal: each configuration (without
    or with ``--tags``) run once."""
    import ddp_fit

    rows = {}

    def row(tags: bool) -> dict:
        if tags not in rows:
            out = tmp_path_factory.mktemp("one")
            ddp_fit.run(1, "auto", out, tags=tags)
            rows[tags] = _csv_row(out)
        return rows[tags]

    return row


@pytest.mark.parametrize("strategy, tags", [("ddp", False), ("ddp_spawn", True)], ids=["ddp", "ddp_spawn"])
def test_ddp_fit_with_every_default_logs_what_one_process_logs(tmp_path, strategy, tags, one_process_fit):
    """2 processes (gloo), the callbacks' defaults with TensorBoard and CSV loggers, 7 sequences: fit finishes (a hang
    fails within the process group's timeout) and every logged value equals one process's, the sampler's padding
    dropped (issue 32); generation's max_sequences counts over both ranks. Under ddp_spawn the callbacks also have 4
    tags with tag_keys="all", and generation is paired by time over a 4-tolerance sweep (issue 33: it hung when every
    key went through callback_metrics, which Lightning's spawn launcher sends back through a pipe that blocks past 64
    KiB): callback_metrics holds the headline keys only, and every other key of each report file reaches the CSV
    logger; in the launching process each callback's ``reported`` holds every key of its report file, the same float
    (issue 44: empty before)."""
    import subprocess
    import sys
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import ddp_fit
    from owa_metrics.functional.report import headline_keys

    root, out = Path(__file__).resolve().parents[1], tmp_path / "two"
    subprocess.run([sys.executable, "tests/ddp_fit.py", "--devices", "2", "--strategy", strategy, "--out", str(out),
                    *(["--tags"] if tags else [])], check=True, timeout=240, cwd=root, capture_output=True)
    one, two = one_process_fit(tags), _csv_row(out)
    assert one.keys() == two.keys() and "val/owa/keyboard/accuracy" in one and "val.owa_gen.events/count/sequences" in one
    assert all(close(two[k], one[k], 1e-6) for k in one), {k: (two[k], one[k]) for k in one if not close(two[k], one[k])}
    # each sequence once (issue 32: the sampler's padding dropped), generation from all of them
    assert two["val.owa.events/count/sequences"] == ddp_fit.SEQUENCES == two["val.owa_gen.events/count/sequences"]
    for logger in ("csv", "tb"):  # each callback's report, in each logger's run
        for prefix in ("owa", "owa_gen"):
            report = json.loads((out / logger / "version_0" / "owa_metrics" / "val" / prefix /
                                 "epoch_0_step_0.json").read_text())
            assert close(report["comparable_rate"], two[f"val/{prefix}/comparable_rate"], 1e-6)
    events = EventAccumulator(str(out / "tb" / "version_0"), size_guidance={"images": 0})
    events.Reload()
    assert {"val/owa/category_confusion", "val/owa_gen/category_confusion"} <= set(events.Tags()["images"])
    if not tags:
        return
    returned = set(json.loads((out / "callback_metrics.json").read_text()))
    launcher = json.loads((out / "reported.json").read_text())
    files = {}
    headline = {f"val/owa/{k}" for k in headline_keys("teacher_forcing")} | {
        f"val/owa_gen/{k}" for k in headline_keys("generation")}
    assert "val/owa/comparable_rate" in returned and {n for n in returned if n.startswith("val")} <= headline
    rows = list(csv.DictReader((out / "csv" / "version_0" / "metrics.csv").open()))
    logged = {k: float(v) for r in rows for k, v in r.items() if k.startswith("val") and v != ""}
    for prefix in ("owa", "owa_gen"):
        report = json.loads((out / "csv" / "version_0" / "owa_metrics" / "val" / prefix / "epoch_0_step_0.json")
                            .read_text())
        keys = {k for k in report if k not in ("epoch", "step")}
        assert sum(k.startswith("tag/") for k in keys) > 100 and len(keys) > 200
        swept = {f"tag/{t}/detect/f1_within_{ms}ms" for t in ddp_fit.TAGS[:2] for ms in ddp_fit.SWEEP_MS}
        assert prefix == "owa" or swept <= keys
        mine = report_of(logged, f"val/{prefix}/")
        charted = {k for k in keys if report[k] != 0 or unit_of(k) != "count"}  # a zero count is no chart yet
        assert set(mine) == charted and all(close(mine[k], report[k], 1e-6) for k in charted)
        files.update({f"val/{prefix}/{k}": report[k] for k in keys})
    assert launcher == files  # every key of both reports, each the same float


def test_hf_trainer_evaluate_matches_the_callback(tmp_path, tokenizer, vocab, warm_state):
    from transformers import Trainer, TrainingArguments

    from owa_metrics.callbacks import OWAEventMetricsForTrainer

    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    data = event_sequences(vocab)
    adapter = OWAEventMetricsForTrainer(tokenizer)
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_eval_batch_size=4, batch_eval_metrics=True,
                             report_to="none", use_cpu=True)
    hf = Trainer(model=module.model, args=args, eval_dataset=data, data_collator=collate, compute_metrics=adapter,
                 preprocess_logits_for_metrics=adapter.preprocess_logits_for_metrics)
    evaluated = hf.evaluate()

    callback = OWAEventMetricsCallback(tokenizer)
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[callback], enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(module, DataLoader(data, batch_size=4, collate_fn=collate))
    logged = {k: float(v) for k, v in report_of(reported(trainer)).items()}
    for key in ["comparable_rate", "category/macro_f1", "keyboard/ratio", "count/target_events", "status/valid",
                "timestamp/abs_error_p95_ms", "timestamp/signed_error_iqm_ms", "token_accuracy/timestamp"]:
        assert close(evaluated[f"eval_owa/{key}"], logged[key], 1e-6), key


def test_hf_trainer_two_processes_count_every_event_once(tmp_path):
    """Trainer gathers across processes and calls compute_metrics on every rank: the adapter must not sync again."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import hf_evaluate

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               "tests/hf_evaluate.py", "--out", str(tmp_path / "hf_2.json")]
    subprocess.run(command, check=True, timeout=600, cwd=root, capture_output=True)
    hf_evaluate.main(["--out", str(tmp_path / "hf_1.json")])  # one process: this one (no second start-up)
    results = {world: json.loads((tmp_path / f"hf_{world}.json").read_text()) for world in (1, 2)}
    one, two = results[1]["report"], results[2]["report"]
    assert results[2]["world"] == 2 and one["eval_owa/count/sequences"] == 14 == two["eval_owa/count/sequences"]
    keys = [k for k in one if k.startswith("eval_owa/")]
    assert keys and all(close(two[k], one[k], 1e-9) for k in keys)


@pytest.mark.parametrize("returns", ["model_output", "preds"])
def test_validation_step_may_return_an_hf_output_or_argmax_ids(tmp_path, tokenizer, vocab, warm_state, returns):
    class Variant(TinyLM):
        def validation_step(self, batch, batch_idx):
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            self.recorded[-1].append((out.logits.detach().cpu(), batch["labels"].cpu()))
            return out if returns == "model_output" else {"preds": out.logits.argmax(-1), "labels": batch["labels"]}

    module = Variant(vocab.size)
    module.load_state_dict(warm_state)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[OWAEventMetricsCallback(tokenizer)], default_root_dir=tmp_path)
    trainer.validate(module, _loaders(vocab)[1])
    assert not any(tmp_path.rglob("*.json")) and not Path("owa_metrics", "val").exists()  # no logger: no files
    by_hand = _by_hand(tokenizer, module.recorded[0])
    logged = {k: float(v) for k, v in report_of(reported(trainer)).items()}
    assert ("screen/loss" in logged) == (returns == "model_output")  # the loss needs logits
    assert all(close(logged[k], v, 1e-6) for k, v in by_hand.items() if k in logged)
    assert logged["comparable_rate"] == pytest.approx(by_hand["comparable_rate"])


def test_generation_by_time_uses_the_prompts_last_event_as_origin(tmp_path, tokenizer, vocab):
    """A model that skips the first event it should generate: the callback's time pairing equals the oracle with
    the origin at each prompt's last event (read by the string reference path)."""
    from matching_oracle import parse_rows, time_oracle
    from sequence_oracle import sequence_oracle

    _, val = _loaders(vocab)
    sequences = [x["input_ids"].tolist() for x in event_sequences(vocab)]
    seen = []

    def skip_first(input_ids, attention_mask, max_new_tokens):
        rows = []
        for prompt, mask in zip(input_ids, attention_mask):
            kept = prompt[mask.bool()].tolist()
            rest = next(s for s in sequences if s[:len(kept)] == kept)[len(kept):]
            generated = rest[rest.index(vocab.ids["<EVENT_START>"], 1):] if rest.count(vocab.ids["<EVENT_START>"]) > 1 else []
            seen.append((kept, generated, rest))
            rows.append(prompt.tolist() + generated)
        width = max(map(len, rows))
        return [r + [-100] * (width - len(r)) for r in rows]

    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", pairing="time", predict_events=3,
                                       max_sequences=6, generate_fn=skip_first, generated_screens="scored",
                                       generate_output="prompt_and_new")  # its rows are as short as new ids could be
    trainer = _trainer(tmp_path, callback, False, epochs=1)
    trainer.validate(TinyLM(vocab.size), val)
    logged = {k: float(v) for k, v in report_of(reported(trainer)).items()}
    origins = [[e["timestamp_ns"] for e in row if e["status"] == 0][-1] for row in parse_rows([k for k, _, _ in seen], vocab)]
    oracle = time_oracle([g for _, g, _ in seen], [r for _, _, r in seen], vocab, origins=origins)
    assert oracle["count/missing_events"] == len(seen) and oracle["detect/recall"] < 1
    oracle.update(sequence_oracle([g for _, g, _ in seen], [r for _, _, r in seen], vocab, origins)["time"])  # issue 26
    assert oracle["count/path_rows"] + oracle["count/keyboard_sequence_rows"] > 0
    for key, value in oracle.items():
        assert close(logged[key], value, 1e-6), key


class _Tested(TinyLM):
    """TinyLM with a test_step that returns what validation_step does (and records it alike)."""

    def on_test_epoch_start(self):
        self.recorded.append([])

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        return super().validation_step(batch, batch_idx)


def test_each_validation_dataloader_and_test_gets_its_own_report(tmp_path, tokenizer, vocab, warm_state):
    """Two validation dataloaders, validation twice an epoch, then trainer.test: per-dataloader keys (Lightning's
    /dataloader_idx_i) each equal to that dataloader scored alone, a report file per validation and dataloader, and
    the test batches under test/owa/."""
    data = event_sequences(vocab)
    load = partial(DataLoader, batch_size=4, collate_fn=collate)
    a, b = load(data[:8]), load(data[8:])
    module = _Tested(vocab.size)
    module.load_state_dict(warm_state)
    logger = CSVLogger(tmp_path, name="csv")
    trainer = _trainer(tmp_path, OWAEventMetricsCallback(tokenizer), logger, epochs=1, val_check_interval=0.5)
    trainer.fit(module, load(data, shuffle=True), [a, b])
    assert len(module.recorded) == 3  # the sanity check, then two validations in the epoch
    for recorded in module.recorded[1:]:
        alone = [_by_hand(tokenizer, recorded[:2]), _by_hand(tokenizer, recorded[2:])]  # a's two batches, then b's
        assert alone[0]["count/sequences"] == 8 == alone[1]["count/sequences"]
    logged = {k: float(v) for k, v in reported(trainer).items()}
    for idx in range(2):
        mine = report_of(logged, suffix=f"/dataloader_idx_{idx}")
        for key, value in alone[idx].items():
            assert close(mine[key], value, 1e-6), (key, idx)
    assert "val/owa/comparable_rate" not in logged and "val.owa/comparable_rate" not in logged  # no pooled key
    folder = tmp_path / "csv" / "version_0" / "owa_metrics" / "val" / "owa"
    reports = sorted(p.name for p in folder.glob("*.json"))
    assert reports == [f"epoch_0_step_{s}_dataloader_{i}.json" for s in (1, 3) for i in (0, 1)]
    assert json.loads((folder / "epoch_0_step_3_dataloader_1.json").read_text())["count/sequences"] == 8

    validated = trainer.validate(module, [a, b])
    assert [len(module.recorded[-1])] == [4]
    for idx, results in enumerate(validated):  # each dataloader's keys hold its own values (no pooled key)
        by_hand = _by_hand(tokenizer, module.recorded[-1][2 * idx:2 * idx + 2])
        assert close(results[f"val/owa/comparable_rate/dataloader_idx_{idx}"], by_hand["comparable_rate"], 1e-6)
        assert "val/owa/comparable_rate" not in results

    trainer.test(module, a)
    by_hand = _by_hand(tokenizer, module.recorded[-1])
    assert by_hand["count/sequences"] == 8
    for key, value in by_hand.items():
        assert close(report_of(reported(trainer), "test/owa/")[key], value, 1e-6), key
    assert (tmp_path / "csv" / "version_0" / "owa_metrics" / "test" / "owa").is_dir()


def test_teacher_forcing_and_generation_callbacks_checkpoint_and_resume_with_new_settings(tmp_path, tokenizer, vocab,
                                                                                         warm_state, caplog):
    """Both callbacks in one Trainer keep their states apart in the checkpoint and their reports apart; resumed with
    a new prefix and mode, the new settings are used, each difference said once."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def callbacks(prefix, mode):
        return [OWAEventMetricsCallback(tokenizer, prefix=prefix, mode=mode, bin_ms=50),  # + the D2E protocol
                OWAEventMetricsCallback(tokenizer, alignment="generation", prefix="val/owa_gen/", mode=mode,
                                        max_sequences=2, predict_events=1, max_new_tokens=20, bin_ms=50,
                                        bin_shifts=(-1, 1), generated_screens="scored")]

    def fit(epochs, logger, prefix, mode, **kwargs):
        cbs = callbacks(prefix, mode)
        trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=CSVLogger(tmp_path, name=logger),
                            callbacks=[*cbs, ModelCheckpoint(dirpath=tmp_path / "ckpt")], enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0)
        module = TinyLM(vocab.size)
        module.load_state_dict(warm_state)
        with caplog.at_level("INFO"):
            trainer.fit(module, *_loaders(vocab), **kwargs)
        return cbs, (tmp_path / logger / "version_0")

    _, first = fit(1, "first", "val/owa/", "exact")
    checkpoint = next((tmp_path / "ckpt").glob("*.ckpt"))
    saved = torch.load(checkpoint, weights_only=True)["callbacks"]  # a Lightning checkpoint of plain data
    states = [s for key, s in saved.items() if key.startswith("OWAEventMetricsCallback")]
    assert sorted((s["alignment"], s["prefix"], s["mode"]) for s in states) == [
        ("generation", "val/owa_gen/", "exact"), ("teacher_forcing", "val/owa/", "exact")]
    for prefix in ("owa", "owa_gen"):  # (no latency curve: generation's one true event a sequence spans no bins)
        assert sorted(p.name for p in (first / "owa_metrics" / "val" / prefix).iterdir()) == [
            f"epoch_0_step_3{x}" for x in (".json", ".md", "_timeline_0.png", "_timeline_1.png")]
    reports = [json.loads((first / "owa_metrics" / "val" / p / "epoch_0_step_3.json").read_text()) for p in ("owa",
                                                                                                        "owa_gen")]
    assert reports[0]["d2e/num_bins"] > 0 and "d2e/keyboard/sample_count" in reports[0]  # passed through
    # generation: one true event per sequence (predict_events=1) spans no bins (docs/METRICS.md, the range rule)
    assert reports[1]["d2e/num_bins"] == 0 and "d2e/num_bins_shift_1bins" in reports[1] and "d2e/best_shift_bins" not in \
        reports[0]

    caplog.clear()
    resumed, second = fit(2, "second", "val/owa2/", "sketch", ckpt_path=checkpoint)
    header = (second / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "val/owa2/comparable_rate" in header and "val/owa_gen/comparable_rate" in header
    assert not any(key.startswith(("val/owa/", "val.owa.", "val.owa/")) for key in header)
    assert [c.metric.mode for c in resumed] == ["sketch", "sketch"] and hasattr(resumed[0].metric, "timestamp_sketch")
    said = [r.getMessage() for r in caplog.records if "checkpoint's" in r.getMessage()]
    assert len(said) == 2 and all("mode='sketch' (checkpoint: 'exact')" in m for m in said), said
    assert sum("prefix='val/owa2/' (checkpoint: 'val/owa/')" in m for m in said) == 1
    assert json.loads((second / "owa_metrics" / "val" / "owa2" / "epoch_1_step_7.json").read_text())["epoch"] == 1


def test_mlflow_gets_the_reports_as_the_runs_artifacts(tmp_path, tokenizer, vocab, warm_state, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow is in the 'dev' extra (mlflow-skinny)")
    from lightning.pytorch.loggers import MLFlowLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    logger = MLFlowLogger(experiment_name="owa", tracking_uri=f"file:{tmp_path / 'mlruns'}")
    trainer = L.Trainer(accelerator="cpu", logger=logger, callbacks=[OWAEventMetricsCallback(tokenizer)],
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(module, _loaders(vocab)[1])
    client, run = logger.experiment, logger.run_id
    assert [a.path for a in client.list_artifacts(run, "owa_metrics/val/owa")] == [
        f"owa_metrics/val/owa/epoch_0_step_0{x}" for x in (".json", ".md", "_timeline_0.png", "_timeline_1.png")]
    report = json.loads(Path(client.download_artifacts(run, "owa_metrics/val/owa/epoch_0_step_0.json", str(tmp_path)))
                        .read_text())
    by_hand = _by_hand(tokenizer, module.recorded[0])
    assert close(report["comparable_rate"], by_hand["comparable_rate"], 1e-9)
    assert close(client.get_run(run).data.metrics["val/owa/comparable_rate"], by_hand["comparable_rate"], 1e-6)
    assert not (Path.cwd() / "owa_metrics" / "val").exists()  # nothing beside the run


TAG_NAMES = ["game", "editor", "browser", "chess"]  # "chess" tags no sequence: left out


def test_tags_reach_tensorboard_as_keys_and_a_table(tmp_path, tokenizer, vocab, warm_state):
    """Slices through the callback: batch["tag"] (names) under teacher forcing, tag_fn (ids) in generation; each
    tag's logged keys equal the metric run by hand on that tag's rows, and the per-tag table is TensorBoard text and
    a section of the report file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = [{**item, "tag": TAG_NAMES[i % 3]} for i, item in enumerate(event_sequences(vocab))]
    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    ids = lambda batch: torch.tensor([TAG_NAMES.index(t) for t in batch["tag"]])  # noqa: E731
    callbacks = [OWAEventMetricsCallback(tokenizer, tags=TAG_NAMES),
                 OWAEventMetricsCallback(tokenizer, alignment="generation", prefix="val/owa_gen/", tags=TAG_NAMES,
                                         tag_fn=ids, predict_events=2, max_sequences=6, max_new_tokens=40)]
    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=logger, callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(module, DataLoader(data, batch_size=4, collate_fn=collate))

    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    logged = report_of({tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]})
    tags = [TAG_NAMES[i % 3] for i in range(len(data))]
    batch_tags = [tags[4 * k:4 * k + 4] for k in range(len(module.recorded[-1]))]  # the loader keeps the order
    for name in TAG_NAMES[:3]:  # teacher forcing: each tag's keys, by hand on its rows
        rows = [[b for b, tag in enumerate(batch) if tag == name] for batch in batch_tags]
        by_hand = _by_hand(tokenizer, [(logits[r], labels[r]) for (logits, labels), r in zip(module.recorded[-1], rows)
                                       if r])
        assert by_hand["count/sequences"] == tags.count(name)
        for key in ("comparable_rate", "category/macro_f1", "token_accuracy/timestamp", "count/target_events"):
            assert close(logged[f"tag/{name}/{key}"], by_hand[key], 1e-5), (name, key)
    assert not any(key.startswith("tag/chess/") for key in logged)
    generated = report_of({tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]}, "val/owa_gen/")
    assert [generated[f"tag/{name}/count/sequences"] for name in TAG_NAMES[:3]] == [2, 2, 2]  # the first 6 rows
    # the D2E protocol, on by default in generation (issue 46), charted in one group; off under teacher forcing
    d2e = {tag for tag in events.Tags()["scalars"] if tag.split("/", 1)[-1].startswith("d2e/")}
    assert {tag.split("/", 1)[0] for tag in d2e} == {"val.owa_gen.d2e"} and "val.owa_gen.d2e/d2e/num_bins" in d2e, d2e
    assert {k for k in generated if k.startswith("d2e/")} == {tag.split("/", 1)[1] for tag in d2e}

    table = events.Tensors("val/owa/tags")[-1].tensor_proto.string_val[0].decode()
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    assert [row[0] for row in rows] == TAG_NAMES[:3]
    column = header.index("count/sequences")
    assert [int(row[column]) for row in rows] == [tags.count(name) for name in TAG_NAMES[:3]]
    report = (tmp_path / "tb" / "version_0" / "owa_metrics" / "val" / "owa" / "epoch_0_step_0.md").read_text()
    assert "## Per tag" in report and table in report


def test_tags_reach_wandb_as_a_table(tmp_path, tokenizer, vocab, warm_state, monkeypatch):
    """The per-tag table as a W&B table of numbers (an offline run): a row per tag seen, its sequences counted by
    hand and its comparable rate equal to the metric run by hand on that tag's rows."""
    wandb = pytest.importorskip("wandb", reason="W&B is the optional 'wandb' extra")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    data = [{**item, "tag": TAG_NAMES[i % 3]} for i, item in enumerate(event_sequences(vocab))]
    module = TinyLM(vocab.size)
    module.load_state_dict(warm_state)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="owa-metrics-test")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=logger, callbacks=[OWAEventMetricsCallback(
        tokenizer, tags=TAG_NAMES)], enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(module, DataLoader(data, batch_size=4, collate_fn=collate))
    wandb.finish()
    tables = []
    for _ in range(100):  # W&B's service writes the files after finish() returns: wait up to 10 s
        tables = [json.loads(p.read_text()) for p in (tmp_path / "wandb").glob("offline-run-*/files/media/table/**/"
                                                                              "*.table.json")]
        tables = [t for t in tables if t["columns"][0] == "tag"]
        if tables:
            break
        time.sleep(0.1)
    (table,) = tables
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    tags = [TAG_NAMES[i % 3] for i in range(len(data))]
    assert list(rows) == TAG_NAMES[:3]  # "chess" tags no sequence
    batch_tags = [tags[4 * k:4 * k + 4] for k in range(len(module.recorded[-1]))]
    for name in TAG_NAMES[:3]:
        assert rows[name]["count/sequences"] == tags.count(name)
        picked = [[b for b, tag in enumerate(batch) if tag == name] for batch in batch_tags]
        by_hand = _by_hand(tokenizer, [(logits[r], labels[r]) for (logits, labels), r in
                                       zip(module.recorded[-1], picked) if r])
        assert close(rows[name]["comparable_rate"], by_hand["comparable_rate"], 1e-6), name


def test_the_latency_curve_and_the_timelines_reach_tensorboard_and_timeline_sequences_0_draws_none(tmp_path, tokenizer,
                                                                                                   vocab):
    """With bin_shifts the latency curve joins the timelines each epoch, its points the report's shift keys (a model
    that predicts every next token right peaks at shift 0); with timeline_sequences=0 no figure is drawn (the confusion
    matrix stays)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from owa_metrics.events import simulate_session
    from owa_metrics.figures import latency_curve
    from owa_metrics.tokens import token_sequences

    class Right(L.LightningModule):  # predicts each next token as it is
        def validation_step(self, batch, batch_idx):
            return {"preds": torch.roll(batch["labels"], -1, 1), "labels": batch["labels"]}

    val = DataLoader(token_sequences(vocab, simulate_session(30, seed=2), 1024), batch_size=4, collate_fn=collate)
    for name, timelines in (("on", 2), ("off", 0)):
        logger = TensorBoardLogger(tmp_path, name=name)
        callback = OWAEventMetricsCallback(tokenizer, bin_ms=50, bin_shifts=range(-2, 3), timeline_sequences=timelines)
        trainer = L.Trainer(accelerator="cpu", logger=logger, callbacks=[callback], enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=tmp_path)
        trainer.validate(Right(), val)
        events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
        events.Reload()
        folder = Path(logger.log_dir) / "owa_metrics" / "val" / "owa"
        report = json.loads((folder / "epoch_0_step_0.json").read_text())
        if timelines:
            assert set(events.Tags()["images"]) == {"val/owa/category_confusion", "val/owa/timeline_0",
                                                    "val/owa/timeline_1", "val/owa/latency_curve"}
            png = (folder / "epoch_0_step_0_latency_curve.png").read_bytes()
            assert events.Images("val/owa/latency_curve")[0].encoded_image_string == png
            keys = {k: report[f"d2e/keyboard/key_accuracy_shift_{k}bins"] for k in range(-2, 3)}
            assert keys[0] == 1.0 > max(keys[k] for k in (-2, -1, 1, 2)) and report["d2e/best_shift_bins"] == 0
            assert latency_curve(report)["keyboard/key_accuracy"] == keys
        else:
            assert events.Tags()["images"] == ["val/owa/category_confusion"]
            assert sorted(p.name for p in folder.iterdir()) == ["epoch_0_step_0.json", "epoch_0_step_0.md"]
    with pytest.raises(ValueError, match="timeline_sequences"):
        OWAEventMetricsCallback(tokenizer, timeline_sequences=-1)
