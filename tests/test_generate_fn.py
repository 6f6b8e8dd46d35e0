"""Every way a generate_fn returns its rows (issue 32): the prompt as given (left-padded, HF generate's output),
each row's own prompt (ragged lists or right-padded), or the new ids alone, are each read right; anything else
stops the run naming generate_fn."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from transformers.generation.utils import GenerateDecoderOnlyOutput

from owa_metrics.callbacks import OWAEventMetricsCallback
from lightning_fixtures import TinyLM, collate, event_sequences, report_of, reported


@pytest.fixture(scope="module")
def data(vocab):
    return event_sequences(vocab)


def _truth(data):
    sequences = [x["input_ids"].tolist() for x in data]

    def rows(input_ids, attention_mask):
        """Per prompt row: (its prompt as given, its own prompt, the true rest of its sequence)."""
        out = []
        for prompt, mask in zip(input_ids.tolist(), attention_mask.bool().tolist()):
            own = [t for t, m in zip(prompt, mask) if m]
            out.append((prompt, own, next(s for s in sequences if s[:len(own)] == own)[len(own):]))
        return out

    return rows


def _padded(rows, value=0):
    width = max(map(len, rows))
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def _validate(tmp_path, vocab, data, callbacks):
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        limit_val_batches=2)
    trainer.validate(TinyLM(vocab.size), DataLoader(data, batch_size=4, collate_fn=collate))
    return reported(trainer)  # every key of every callback, under its prefix


def test_each_output_shape_of_a_perfect_generate_fn_scores_perfect(tmp_path, tokenizer, vocab, data):
    truth = _truth(data)
    forms = {  # a perfect generator (the true rest of each row) in each shape a generate_fn may return
        "left": lambda rows: _padded([p + rest for p, _, rest in rows]),  # HF generate: the prompts as given
        "dict": lambda rows: GenerateDecoderOnlyOutput(sequences=_padded([p + rest for p, _, rest in rows])),
        "own_lists": lambda rows: [own + rest for _, own, rest in rows],
        "own_padded": lambda rows: _padded([own + rest for _, own, rest in rows], tokenizer.pad_token_id),
        "new": lambda rows: _padded([rest for _, _, rest in rows], tokenizer.pad_token_id),
    }
    widths = set()

    def generate_fn(form):
        def generate(input_ids, attention_mask, max_new_tokens):
            widths.add(tuple(attention_mask.sum(1).tolist()))
            return forms[form](truth(input_ids, attention_mask))
        return generate

    callbacks = [OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=3, max_sequences=8,
                                         prefix=f"val/{form}/", generate_fn=generate_fn(form)) for form in forms]
    logged = _validate(tmp_path, vocab, data, callbacks)
    assert any(len(set(w)) > 1 for w in widths)  # prompts of different lengths in a batch: left != own padding
    reports = {form: {k: float(v) for k, v in report_of(logged, f"val/{form}/").items()} for form in forms}
    plain = reports["new"]  # the new ids alone: nothing to cut
    assert plain["count/sequences"] == 8 and plain["comparable_rate"] == 1.0 and plain["count_accuracy"] == 1.0
    for form, report in reports.items():
        assert report == plain, form


@pytest.mark.parametrize("returned, expected", [
    (lambda rows: [p + rest for p, _, rest in rows][:-1], r"got 3 rows for 4 prompt rows"),
    (lambda rows: [own + rest if i % 2 else rest for i, (_, own, rest) in enumerate(rows)],
     r"rows \[1, 3\] hold their prompt \(at columns \[0, 0\]\), rows \[0, 2\] do not"),
    (lambda rows: [own[1:] + rest for _, own, rest in rows],  # a prompt of its own (re-tokenized, say)
     r"rows of \d+ ids \(more than max_new_tokens=100\) hold none of the prompts given"),
    (lambda rows: _padded([p + rest for p, _, rest in rows]).float(), r"got Tensor of shape \(4, \d+\) / torch.float32"),
    (lambda rows: torch.tensor(rows[0][0] + rows[0][2]), r"got Tensor of shape \(\d+,\)"),
], ids=["rows missing", "rows read two ways", "other prompts", "float", "1-D"])
def test_an_output_generate_fn_cannot_be_read_stops_the_run(tmp_path, tokenizer, vocab, data, returned, expected):
    truth = _truth(data)
    callback = OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=3, max_new_tokens=100,
                                       generate_fn=lambda ids, mask, new: returned(truth(ids, mask)))
    with pytest.raises(RuntimeError, match=r"cannot read what generate_fn returned at validation batch 0 \(\w+Error: "
                                           + expected + r".*\)\. generate_fn\(input_ids, attention_mask, "
                                           r"max_new_tokens\) must return one row per prompt row"):
        _validate(tmp_path, vocab, data, [callback])
