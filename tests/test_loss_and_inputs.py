"""update(..., token_loss=), the HF Trainer adapter with batch_eval_metrics off and on, and the package's collate."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from owa_metrics import OWAEventMetrics, align_teacher_forcing
from owa_metrics.callbacks import OWAEventMetricsCallback
from owa_metrics.tokens import collate
from lightning_fixtures import TinyLM, event_sequences, report_of, reported
from oracles import close


@pytest.fixture(scope="module")
def data(vocab):
    return event_sequences(vocab, limit=8)


def _logits_oracle(tokenizer, batches):
    """The logits path (its loss keys pinned against a plain-Python oracle in test_metrics) over (logits, labels)."""
    metric = OWAEventMetrics(tokenizer)
    for logits, labels in batches:
        preds, target = align_teacher_forcing(logits, labels)
        metric.update(preds, target, logits=logits[:, :-1])
    return {k: float(v) for k, v in metric.compute().items()}


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_token_loss_equals_the_logits_path(tokenizer, vocab, data, backend):
    labels = collate(data[:4])["labels"][:, 1:].clone()
    first, second = ((labels[row] >= 0).nonzero()[3, 0] for row in (0, 1))
    labels[1, second] = vocab.size + 3  # a label past the vocabulary: skipped by both
    torch.manual_seed(0)
    logits = torch.randn(*labels.shape, vocab.size) * 3
    logits[0, first] = float("nan")  # a non-finite loss: skipped by both
    preds = logits.argmax(-1)
    # by hand, as a model returns it with reduction="none" (ignored labels: 0), NaN where the label is past V
    token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(0, vocab.size - 1),
                                                   reduction="none", ignore_index=-100)
    token_loss = torch.where(labels >= vocab.size, float("nan"), token_loss).to(torch.bfloat16).float()
    reports = []
    for kwargs in ({"logits": logits}, {"token_loss": token_loss}):
        metric = OWAEventMetrics(tokenizer, backend=backend)
        metric.update(preds, labels, **kwargs)
        reports.append({k: float(v) for k, v in metric.compute().items()})
    by_logits, by_loss = reports
    assert by_logits.keys() == by_loss.keys() and any(k.endswith("/loss") for k in by_loss)
    assert by_loss["count/loss_skipped_tokens"] == 2 == by_logits["count/loss_skipped_tokens"]
    tolerance = {k: 1e-2 for k in by_loss if k.endswith("loss") or k.endswith("loss_sum")}  # bfloat16 loss
    assert all(close(by_loss[k], v, tolerance.get(k, 1e-9)) for k, v in by_logits.items())
    exact = OWAEventMetrics(tokenizer, backend=backend)  # float32 loss: equal to 1e-6
    float32 = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(0, vocab.size - 1), reduction="none")
    exact.update(preds, labels, token_loss=float32.masked_fill(labels >= vocab.size, torch.inf))
    assert all(close(float(v), by_logits[k], 1e-6) for k, v in exact.compute().items())
    with pytest.raises(ValueError, match="not both"):
        metric.update(preds, labels, logits=logits, token_loss=token_loss)


def test_the_callback_reads_token_loss_with_the_hf_shift(tmp_path, tokenizer, vocab, data):
    """validation_step returns argmax ids and the HF-shifted per-token loss [B, T - 1] (at t: label t + 1's)."""
    class FusedLoss(TinyLM):
        def validation_step(self, batch, batch_idx):
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            self.recorded[-1].append((logits.detach().cpu(), batch["labels"].cpu()))
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:],
                                                     reduction="none")
            return {"preds": logits.argmax(-1), "labels": batch["labels"], "token_loss": loss}

    module = FusedLoss(vocab.size)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[OWAEventMetricsCallback(tokenizer, artifacts=False)], default_root_dir=tmp_path)
    trainer.validate(module, DataLoader(data, batch_size=4, collate_fn=collate))
    logged = {k: float(v) for k, v in report_of(reported(trainer)).items()}
    oracle = _logits_oracle(tokenizer, module.recorded[0])
    assert logged.keys() == oracle.keys() and any(k.endswith("/loss") for k in logged)
    assert all(close(logged[k], v, 1e-6) for k, v in oracle.items())


def test_hf_trainer_with_batch_eval_metrics_off_and_on(tmp_path, tokenizer, vocab, data):
    from transformers import Trainer, TrainingArguments

    from owa_metrics.callbacks import OWAEventMetricsForTrainer

    model = TinyLM(vocab.size).model
    results = {}
    for batched in (False, True):
        adapter = OWAEventMetricsForTrainer(tokenizer)
        args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_eval_batch_size=3, report_to="none",
                                 batch_eval_metrics=batched, use_cpu=True)
        trainer = Trainer(model=model, args=args, eval_dataset=data, data_collator=collate, compute_metrics=adapter,
                          preprocess_logits_for_metrics=adapter.preprocess_logits_for_metrics)
        results[batched] = {k[len("eval_owa/"):]: v for k, v in trainer.evaluate().items() if k.startswith("eval_owa/")}
    model.eval()
    with torch.no_grad():  # the same batches (3, 3, 2: the last is short), by hand
        batches = [collate(data[i:i + 3]) for i in range(0, len(data), 3)]
        oracle = _logits_oracle(tokenizer, [(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                                             b["labels"]) for b in batches])
    off, on = results[False], results[True]
    assert off.keys() == on.keys() == oracle.keys() and {"screen/loss", "screen/loss_sum"} <= off.keys()
    assert off["count/sequences"] == len(data)
    for key, value in oracle.items():
        assert close(off[key], value, 1e-6) and close(on[key], value, 1e-6), (key, off[key], on[key], value)


def test_collate_masks_by_length_not_by_id_0():
    items = [{"input_ids": torch.tensor([0, 5, 0]), "labels": torch.tensor([0, -100, 0])},
             {"input_ids": torch.tensor([0]), "labels": torch.tensor([0])}]  # id 0: a real token (a BPE's first)
    batch = collate(items, pad_id=0)
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[0, -100, 0], [0, -100, -100]]
    assert batch["input_ids"].tolist() == [[0, 5, 0], [0, 0, 0]]
    images = [{"input_ids": torch.tensor([1, 2]), "pixel_values": torch.full((2, 3), float(i))} for i in range(2)]
    assert collate(images)["pixel_values"][:, 0].tolist() == [0, 0, 1, 1]  # one entry per image, in item order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_block_loss_reads_the_log_sum_exp_and_the_label_logit(dtype, monkeypatch):
    """The token loss as log-sum-exp minus the label's logit (no log-softmax written out), in the CPU's blocks of
    bounded size (here 120 logits: 3 positions a block, then one), equals a float64 numpy oracle of the definition
    and the cross-entropy of the float32 logits (the path it replaces) to 1e-5; NaN / inf logits and labels past
    the vocabulary are skipped as before."""
    import numpy as np

    from owa_metrics.functional import tokens

    monkeypatch.setattr(tokens, "CPU_BLOCK_LOGITS", 120)
    g = torch.Generator().manual_seed(3)
    for vocab_size in (40, 300):
        target = torch.randint(-4, vocab_size + 3, (2, 5), generator=g)
        target = torch.where(target < 0, -100, target)
        target[0, 0], target[1, 1] = 0, vocab_size - 1
        logits = (torch.randn(2, 5, vocab_size, generator=g) * 4).to(dtype)
        logits[1, 2, 7], logits[1, 3, 5] = float("nan"), float("inf")
        target[1, 2], target[1, 3] = 3, 2
        loss, skipped = tokens.token_losses(logits, target)
        z, labels = logits.double().numpy().reshape(-1, vocab_size), target.numpy().reshape(-1)
        want, want_skipped = np.zeros(labels.size), 0
        for i, label in enumerate(labels):
            if label >= 0:
                top = z[i].max()
                with np.errstate(invalid="ignore"):  # inf - inf: NaN, skipped
                    value = top + np.log(np.exp(z[i] - top).sum()) - z[i][min(label, vocab_size - 1)]
                ok = label < vocab_size and np.isfinite(value)
                want[i], want_skipped = (value, want_skipped) if ok else (0.0, want_skipped + 1)
        np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5, atol=1e-5)
        assert float(skipped) == want_skipped >= 2
        labelled = (target.reshape(-1) >= 0) & (target.reshape(-1) < vocab_size)
        rows = logits.reshape(-1, vocab_size)[labelled].float()
        before = torch.nn.functional.cross_entropy(rows, target.reshape(-1)[labelled], reduction="none").double()
        finite = torch.isfinite(before)
        torch.testing.assert_close(loss[labelled][finite], before[finite], rtol=1e-5, atol=1e-5)
        assert (loss[labelled][~finite] == 0).all() and (~finite).sum() == 2
