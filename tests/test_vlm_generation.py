"""A tiny random-weight InternVL (transformers' InternVLForConditionalGeneration), factorized tokens with InternVL
image tokens, through the Lightning callback: teacher forcing, and generation with the prompts' images."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from owa_metrics import CodecConfig, VocabMap
from owa_metrics.callbacks import OWAEventMetricsCallback
from owa_metrics.callbacks.generation import PromptInputsError, prompt_inputs
from owa_metrics.events import simulate_session
from owa_metrics.tokens import collate, token_sequences
from lightning_fixtures import report_of, reported


def internvl_tokenizer():
    """A stand-in for InternVL's tokenizer (offline: id 0 a real token, its image tokens), the event tokens added
    as upstream OWA training adds them."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<|endoftext|>", "<unk>", "<img>", "</img>", "<IMG_CONTEXT>"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[^<>]*>"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<|endoftext|>",
                                        eos_token="<|endoftext|>")
    tokenizer.add_tokens(sorted(CodecConfig.preset("factorized").event_tokens))
    return tokenizer


def tiny_internvl(tokenizer):
    """64 x 64 images in 2 x 2 patches, pixel-shuffled by 0.5: 256 image tokens an image, as InternVL3's."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    torch.manual_seed(0)
    config = InternVLConfig(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=[64, 64], patch_size=[2, 2]),
        text_config=dict(model_type="qwen2", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"), image_seq_length=256)
    return InternVLForConditionalGeneration(config).eval()


class VLM(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def validation_step(self, batch, batch_idx):
        return self.model(**batch)  # an HF ModelOutput: the callback reads its logits and batch["labels"]


@pytest.fixture(scope="module")
def setup():
    tokenizer = internvl_tokenizer()
    vocab = VocabMap.from_tokenizer(tokenizer)
    events = simulate_session(12, seed=0, screen_hz=2.0, format="factorized")
    sequences = token_sequences(vocab, events, 700)
    data = [sequences[i] for i in (0, 12, 2, 16)]  # 12 and 16: a screen among the last 3 events (not prompted)
    image = vocab.ids["<img>"]
    for n, item in enumerate(data):  # one frame per screen event: image k of item n filled with 100 n + k
        screens = int((item["input_ids"] == image).sum())
        item["pixel_values"] = (100 * n + torch.arange(screens, dtype=torch.float))[:, None, None, None].expand(
            screens, 3, 64, 64).contiguous()
    return tokenizer, vocab, data, tiny_internvl(tokenizer)


def _validate(tmp_path, model, callback, data):
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback], default_root_dir=tmp_path)
    trainer.validate(VLM(model), DataLoader(data, batch_size=2, collate_fn=collate))
    return {k: float(v) for k, v in report_of(reported(trainer)).items()}


def test_internvl_teacher_forcing_and_generation_with_the_prompts_images(tmp_path, setup):
    tokenizer, vocab, data, model = setup
    assert [len(item["pixel_values"]) for item in data] == [2, 2, 0, 2]  # a row without images too
    teacher = _validate(tmp_path, model, OWAEventMetricsCallback(tokenizer, artifacts=False), data)
    assert teacher["count/sequences"] == 4 and teacher["status/invalid_target_rate"] == 0 and "screen/loss" in teacher

    calls = []
    generate = model.generate

    def recording(*args, **kwargs):  # the real generate, its inputs kept
        calls.append(kwargs)
        return generate(*args, **kwargs)

    model.generate = recording
    try:
        callback = OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=3, max_new_tokens=24,
                                           artifacts=False)
        generated = _validate(tmp_path, model, callback, data)
    finally:
        del model.generate
    assert generated["count/sequences"] == 4 and len(calls) == 2
    image, passed, total = vocab.ids["<img>"], 0, 0
    for batch_idx, call in enumerate(calls):  # oracle: each prompt row's first screens, counted in its own ids
        expected = []
        for row, (ids, mask) in enumerate(zip(call["input_ids"], call["attention_mask"])):
            item = data[2 * batch_idx + row]
            screens = int((ids[mask.bool()] == image).sum())
            expected.append(item["pixel_values"][:screens])
            passed, total = passed + screens, total + len(item["pixel_values"])
        assert torch.equal(call["pixel_values"], torch.cat(expected))
    assert 0 < passed < total  # the images of the generated events' screens stayed out


def test_inputs_the_default_generation_cannot_cut_raise(setup):
    tokenizer, vocab, data, model = setup
    batch = {**collate(data[:2]), "image_sizes": torch.tensor([[64, 64]] * 2)}
    with pytest.raises(PromptInputsError, match=r"\['image_sizes'\].*generate_fn\(input_ids, attention_mask"):
        prompt_inputs(batch, torch.tensor([10, 10]), model.config.image_token_id)
    with pytest.raises(PromptInputsError, match="pixel_values"):  # a model that names no image token
        prompt_inputs(collate(data[:2]), torch.tensor([10, 10]), None)
