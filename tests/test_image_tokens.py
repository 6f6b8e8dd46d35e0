"""Issue 32, item 5: Qwen2-VL / Qwen2.5-VL image tokens are detected like InternVL's and SmolVLM's, and
``owa-metrics evaluate`` takes a model's image tokens, its warning naming that flag when the screens hold others."""

import pytest
import torch

from owa_metrics import CodecConfig, Event, OWAEventMetrics, Status, VocabMap, decode_batch
from owa_metrics.cli import main
from owa_metrics.tokens.vocab import image_tokens
from test_formats import user_tokenizer

QWEN = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def _screen(vocab, n_images):
    """A screen at 1.50 s with ``n_images`` Qwen image tokens, by hand."""
    ids = vocab.encode([Event("screen", 1_500_000_000)])  # prefix, image x count, suffix
    image, start, end = (vocab.ids[t] for t in QWEN[1:2] + QWEN[:1] + QWEN[2:])
    head = ids[:ids.index(start)]
    return head + [start] + [image] * n_images + [end] + ids[ids.index(end) + 1:]


@pytest.mark.parametrize("fmt", ["hierarchical", "factorized"])
def test_a_qwen2_vl_tokenizer_is_detected_and_its_screens_decode(fmt):
    tokenizer = user_tokenizer(CodecConfig.preset(fmt).event_tokens, QWEN + ["<|im_start|>", "<|video_pad|>"])
    vocab = VocabMap.from_tokenizer(tokenizer)
    c = vocab.config
    assert (c.format, c.image_prefix, c.image_token, c.image_suffix) == (fmt, ("<|vision_start|>",),
                                                                         "<|image_pad|>", ("<|vision_end|>",))
    assert "<|vision_start|> <|image_pad|> x 256 <|vision_end|>" in vocab.describe()
    ids = torch.tensor([_screen(vocab, 64) + _screen(vocab, 3)])  # a run of any length
    batch = decode_batch(ids, ids, vocab)
    assert batch.status.tolist() == [int(Status.VALID)] * 2
    metric = OWAEventMetrics(tokenizer)  # teacher forcing scores screens: both valid, nothing warned
    metric.update(ids, ids)
    assert metric.compute()["screen/count"] == 2


def test_image_tokens_read_a_name_or_the_description():
    assert image_tokens("Qwen2.5-VL") == image_tokens("qwen2-vl") == (("<|vision_start|>",), "<|image_pad|>", 256,
                                                                       ("<|vision_end|>",))
    assert image_tokens("<img> <IMG_CONTEXT> x 256 </img>") == image_tokens("InternVL")
    assert image_tokens("<image> x 576") == ((), "<image>", 576, ())  # LLaVA: no prefix, no suffix
    with pytest.raises(ValueError, match="PREFIX... IMAGE x COUNT"):
        image_tokens("<img> <IMG_CONTEXT> </img>")


def test_evaluate_takes_the_image_tokens_and_its_warning_names_the_flag(tmp_path, capsys):
    """Qwen2-VL screens between key presses, screens scored: read with the default (SmolVLM) image tokens they do not
    decode, and the warning points at --image-tokens Qwen2-VL (not --format); with it, every event decodes."""
    key = "<EVENT_START><KEYBOARD><1><0><{}><65><press><EVENT_END>"
    screen = "<EVENT_START><SCREEN><1><5><{}><|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|><EVENT_END>"
    line = "".join(key.format(d) + screen.format(d) for d in range(8))
    (tmp_path / "true.txt").write_text(line + "\n")
    args = ["evaluate", "--pred", str(tmp_path / "true.txt"), "--target", str(tmp_path / "true.txt"), "--json",
            str(tmp_path / "r.json"), "--generated-screens", "scored"]
    assert main(args + ["--strict"]) == 1
    [warning] = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert "8 of 16 true events (50%) do not decode" in warning and warning.endswith("--image-tokens Qwen2-VL")
    assert "--format" not in warning
    assert main(args + ["--strict", "--image-tokens", "Qwen2-VL"]) == 0
    assert "warning" not in capsys.readouterr().err
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status/valid"] == 16 and report["screen/count"] == 8
    assert main(args + ["--image-tokens", "<|image_pad|>"]) == 2  # no count: one line saying what to give
    assert "PREFIX... IMAGE x COUNT SUFFIX..." in capsys.readouterr().err
