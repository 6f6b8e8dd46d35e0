"""Issue 8: a user's tokenizer in either format is detected (format and image tokens) and every metric keeps its
meaning; a mis-configured run warns."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from owa_metrics import CodecConfig, OWAEventMetrics, VocabMap
from owa_metrics.events import read_recording
from conftest import recording_paths
from factorized_oracle import normalized_factorized
from metric_oracle import FORMATS, oracle_report, perturb
from oracles import normalized
from test_metrics import _batch_from, _chunks, _compare

INTERNVL = ["<img>", "<IMG_CONTEXT>", "</img>"]
SMOLVLM = ["<fake_token_around_image>", "<global-img>", "<image>"]
NORMALIZE = {"hierarchical": normalized, "factorized": normalized_factorized}


def user_tokenizer(event_tokens, image_tokens=()):
    """A small BPE trained on local text, event (and image) tokens added afterwards as upstream OWA does."""
    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    tokenizer.add_tokens(sorted(set(event_tokens) | set(image_tokens)))
    return tokenizer


@pytest.mark.parametrize("fmt, images, image_token, count", [("factorized", INTERNVL, "<IMG_CONTEXT>", 256),
                                                              ("hierarchical", SMOLVLM, "<image>", 64)])
def test_user_tokenizer_is_detected_and_the_report_equals_the_oracle(fmt, images, image_token, count):
    tokenizer = user_tokenizer(CodecConfig.preset(fmt).event_tokens, images)
    metric = OWAEventMetrics(tokenizer, alignment="generation", generated_screens="scored")
    config = metric.vocab.config
    assert (config.format, config.image_token, config.image_token_count) == (fmt, image_token, count)
    assert f"{fmt} format" in repr(metric) and f"{image_token} x {count}" in repr(metric)

    rng = np.random.default_rng(3)
    oracle_in = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a well configured run: no invalid-target warning
        for path in recording_paths():
            chunks = _chunks(read_recording(path, format=fmt), rng, (20, 120))
            for lo in range(0, len(chunks), 4):
                seqs = [(perturb(c, rng), c) for c in chunks[lo:lo + 4]]
                preds, target, inp = _batch_from(metric.vocab, seqs, rng, corrupt=0.02, normalize=NORMALIZE[fmt],
                                                 ignore_images=bool(lo % 8))  # image labels kept or -100
                metric.update(preds, target)
                oracle_in += inp
        report = metric.compute()
    assert report["status/invalid_target_rate"] == 0 and report["screen/count"] > 500
    _compare(report, oracle_report(oracle_in, FORMATS[fmt]))
    levels = 5 if fmt == "factorized" else 4
    assert f"mouse/dx_precision_p{levels}" in report and f"mouse/dx_precision_p{levels + 1}" not in report


def test_mis_configured_image_tokens_warn_once_and_log_the_rate(recwarn):
    tokenizer = user_tokenizer(CodecConfig.preset("factorized").event_tokens, INTERNVL)
    right = VocabMap.from_tokenizer(tokenizer)  # detected: factorized, InternVL images
    events = read_recording(recording_paths()[0], format="factorized")[:200]
    ids = np.array(right.encode(events))[None]
    import torch

    target = torch.from_numpy(ids)
    wrong = OWAEventMetrics(tokenizer, config=CodecConfig.preset("factorized"))  # SmolVLM's image tokens: a trap
    wrong.update(target, target)
    with pytest.warns(UserWarning, match=r"do not decode \(most often: invalid_format\).*image_token") as caught:
        report = wrong.compute()
    assert len([w for w in caught if "do not decode" in str(w.message)]) == 1
    screens = sum(e.kind == "screen" for e in events)
    assert report["status/invalid_target_rate"] == pytest.approx(screens / len(events)) and screens > 10

    good = OWAEventMetrics(tokenizer)
    good.update(target, target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert good.compute()["status/invalid_target_rate"] == 0


def test_detection_refuses_ambiguous_or_foreign_vocabularies():
    both = user_tokenizer(CodecConfig.preset("factorized").event_tokens + CodecConfig().event_tokens)
    with pytest.raises(ValueError, match="several formats.*format='hierarchical' or format='factorized'"):
        VocabMap.from_tokenizer(both)
    assert VocabMap.from_tokenizer(both, format="factorized").config.format == "factorized"
    with pytest.raises(ValueError, match="lacks OWA event tokens.*hierarchical misses <EVENT_START>.*factorized misses"):
        VocabMap.from_tokenizer(user_tokenizer([]))
    with pytest.raises(TypeError, match="Hugging Face tokenizer"):
        OWAEventMetrics("gpt2")
