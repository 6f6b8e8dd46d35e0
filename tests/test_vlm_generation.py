"""A tiny random-weight InternVL (transformers' InternVLForConditionalGeneration), factorized tokens with InternVL
image tokens, through the Lightning callback: teacher forcing, and generation with the prompts' images; the default
generation of LLaVA, Idefics3 / SmolVLM, Qwen2-VL and Qwen2.5-VL, each in its processor's layout (issue 32)."""

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
from oracles import expected_prompt


def internvl_tokenizer():
    """A stand-in for InternVL's tokenizer (offline: id 0 a real token, its image tokens), the event tokens added
    as upstream OWA training adds them."""
    return stand_in_tokenizer(["<img>", "</img>", "<IMG_CONTEXT>"])


def stand_in_tokenizer(image_tokens):
    """A stand-in for a VLM's tokenizer: id 0 a real token, then ``image_tokens``, the factorized event tokens added."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<|endoftext|>", "<unk>", *image_tokens]
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
    data = [sequences[i] for i in (0, 11, 2, 15)]  # 11 and 15: a screen among the last 4 actions (not prompted)
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
        callback = OWAEventMetricsCallback(tokenizer, alignment="generation", predict_events=4, max_new_tokens=24,
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


# ------------------------------------------------------------------ the other families' default generation (issue 32)
QWEN_IMAGES = ("<|vision_start|>",), "<|image_pad|>", ("<|vision_end|>",)
FAMILIES = {  # a screen's image tokens (prefix, token, suffix): 16 image tokens (Qwen: 4, or 2)
    "llava": ((), "<image>", ()),
    "idefics3": (("<fake_token_around_image>", "<global-img>"), "<image>", ("<fake_token_around_image>",)),
    "qwen2_vl": QWEN_IMAGES,
    "qwen2_5_vl": QWEN_IMAGES,
}
GRIDS = ((1, 4, 4), (1, 2, 4))  # Qwen: image k has grid GRIDS[k % 2], 16 or 8 patches of 2 x 2 x 2 x 3, 4 or 2 tokens


def tiny_family_model(family, tokenizer, positions=2048):
    """A 1-layer random-weight model of ``family``, built from its config: 16 image tokens an 8 x 8 (LLaVA) or
    16 x 16 (Idefics3, pixel-shuffled by 2) image; Qwen: 2 x 2 patches merged 2 x 2; ``positions``: its text
    config's max_position_embeddings."""
    import transformers as tf

    torch.manual_seed(0)
    ids = tokenizer.convert_tokens_to_ids
    text = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=positions, bos_token_id=None,
                eos_token_id=ids("<|endoftext|>"), pad_token_id=ids("<|endoftext|>"))
    image = ids(FAMILIES[family][1])
    if family == "llava":
        config = tf.LlavaConfig(vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                                                   num_hidden_layers=1, num_attention_heads=2, image_size=8,
                                                   patch_size=2, projection_dim=16),
                                text_config=dict(model_type="llama", **text), image_token_id=image)
        return tf.LlavaForConditionalGeneration(config).eval()
    if family == "idefics3":
        config = tf.Idefics3Config(vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                      num_attention_heads=2, image_size=16, patch_size=2),
                                   text_config=dict(model_type="llama", **text), image_token_id=image, scale_factor=2)
        return tf.Idefics3ForConditionalGeneration(config).eval()
    vision = dict(depth=1, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    rope = dict(rope_type="default", mrope_section=[2, 3, 3], rope_theta=10000.0)
    tokens = dict(image_token_id=image, vision_start_token_id=ids("<|vision_start|>"),
                  vision_end_token_id=ids("<|vision_end|>"), video_token_id=ids("<|video_pad|>"))
    if family == "qwen2_vl":
        config = tf.Qwen2VLConfig(vision_config=dict(embed_dim=16, hidden_size=32, mlp_ratio=2, **vision),
                                  text_config=dict(**text, rope_parameters=rope), **tokens)
        return tf.Qwen2VLForConditionalGeneration(config).eval()
    config = tf.Qwen2_5_VLConfig(vision_config=dict(hidden_size=16, out_hidden_size=32, intermediate_size=32,
                                                    fullatt_block_indexes=[0], **vision),
                                 text_config=dict(**text, rope_parameters=rope), **tokens)
    return tf.Qwen2_5_VLForConditionalGeneration(config).eval()


def _runs(ids, image):
    """Each run of ``image`` tokens in ``ids`` (1-D): its index, at each token (-1 off the runs)."""
    is_image = ids == image
    first = is_image & ~torch.cat([torch.zeros(1, dtype=torch.bool), is_image[:-1]])
    return torch.where(is_image, first.long().cumsum(0) - 1, -1)


def family_data(family, vocab):
    """Four sequences (a screen among the last 3 actions of the first, none in the second) with their frames as the
    family's processor gives one sample; image k of item n is filled with 100 n + k + 1. Returns (items, images): each
    item's images, as the oracle reads them (pixels, and the Qwen grid)."""
    image, start = vocab.ids[FAMILIES[family][1]], vocab.ids["<EVENT_START>"]
    sequences = token_sequences(vocab, simulate_session(20, seed=1, screen_hz=4.0, format="factorized"), 160)

    def tail_screen(x):  # a screen among the last 3 actions (screens are context: the prompt ends before them)
        ids = x["input_ids"]
        actions = ((ids[:-1] == start) & (ids[1:] != vocab.ids["<SCREEN>"])).nonzero()
        return len(actions) > 3 and bool((ids[int(actions[-3]):] == image).any())  # (the first action: context)

    screens = [int(_runs(x["input_ids"], image).max()) + 1 for x in sequences]
    picks = [next(i for i, x in enumerate(sequences) if screens[i] >= 2 and tail_screen(x)),
             screens.index(0)]
    picks += [i for i in range(len(sequences)) if screens[i] >= 2 and i not in picks][:2]
    items, images = [], []
    for n, i in enumerate(picks):
        item = dict(sequences[i])
        if family.startswith("qwen"):  # every second image a smaller grid: 2 image tokens, not 4
            keep = ~((_runs(item["input_ids"], image) % 2 == 1) & _late_in_run(_runs(item["input_ids"], image), 2))
            item = {k: v[keep] for k, v in item.items()}
        count = screens[i]
        if family in ("llava", "idefics3"):
            side = 8 if family == "llava" else 16
            frames = (100 * n + 1 + torch.arange(count, dtype=torch.float))[:, None, None, None].expand(
                count, 3, side, side).contiguous()
            images.append([(f, None) for f in frames])
            item["pixel_values"] = frames if family == "llava" else frames[None]
            if family == "idefics3":
                item["pixel_attention_mask"] = torch.ones(1, count, side, side, dtype=torch.bool)
        else:
            grids = torch.tensor([GRIDS[k % 2] for k in range(count)], dtype=torch.long).reshape(count, 3)
            patches = [torch.full((int(g.prod()), 24), 100.0 * n + k + 1) for k, g in enumerate(grids)]
            images.append(list(zip(patches, grids)))
            item["pixel_values"] = torch.cat(patches) if patches else torch.zeros(0, 24)
            item["image_grid_thw"] = grids
            item["mm_token_type_ids"] = (item["input_ids"] == image).long()
        items.append(item)
    return items, images


def _late_in_run(runs, keep):
    """True at the tokens of a run after its first ``keep``."""
    first = torch.zeros(len(runs), dtype=torch.long)
    for i in range(1, len(runs)):  # test data: a plain loop over 160 tokens
        first[i] = first[i - 1] + 1 if runs[i] >= 0 and runs[i] == runs[i - 1] else 0
    return (runs >= 0) & (first >= keep)


def family_config(family):
    prefix, token, suffix = FAMILIES[family]
    return CodecConfig.preset("factorized", image_prefix=prefix, image_token=token, image_suffix=suffix,
                              image_token_count=4 if family.startswith("qwen") else 16)


@pytest.fixture(scope="module")
def families():
    """Each family's (tokenizer, codec config, vocab, items, their images, tiny model)."""
    out = {}
    for family, (prefix, token, suffix) in FAMILIES.items():
        videos = ["<|video_pad|>"] if family.startswith("qwen") else []
        tokenizer = stand_in_tokenizer(list(dict.fromkeys([*prefix, token, *suffix, *videos])))
        config = family_config(family)
        vocab = VocabMap.from_tokenizer(tokenizer, config=config)
        out[family] = (tokenizer, config, vocab, *family_data(family, vocab),
                       tiny_family_model(family, tokenizer))
    return out


def _expected_inputs(family, rows, call, image):
    """The inputs besides the ids that generate must get for prompts showing ``rows`` (each prompt's images)."""
    shown, out = [im for row in rows for im in row], {}
    if family.startswith("qwen"):
        out["mm_token_type_ids"] = ((call["input_ids"] == image) & call["attention_mask"].bool()).long()
        if shown:
            out["pixel_values"] = torch.cat([patches for patches, _ in shown])
            out["image_grid_thw"] = torch.stack([grid for _, grid in shown])
    elif shown and family == "idefics3":  # [rows, most images, ...], zero-padded
        most = max(map(len, rows))
        out["pixel_values"] = torch.zeros(len(rows), most, 3, 16, 16)
        out["pixel_attention_mask"] = torch.zeros(len(rows), most, 16, 16, dtype=torch.bool)
        for b, row in enumerate(rows):
            for k, (frame, _) in enumerate(row):
                out["pixel_values"][b, k], out["pixel_attention_mask"][b, k] = frame, True
    elif shown:
        out["pixel_values"] = torch.stack([frame for frame, _ in shown])
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_generates_with_its_prompts_images(tmp_path, families, family):
    """The package's collate makes the family's batch (the model's forward takes it in validation_step), and each
    generate call gets exactly the images whose tokens are in its prompts, in the family's layout."""
    tokenizer, config, vocab, items, images, model = families[family]
    image, calls, generate = vocab.ids[FAMILIES[family][1]], [], model.generate

    def recording(*args, **kwargs):  # the real generate, its inputs kept
        calls.append(kwargs)
        return generate(*args, **kwargs)

    model.generate = recording
    try:
        callback = OWAEventMetricsCallback(tokenizer, config=config, alignment="generation", predict_events=3,
                                           max_new_tokens=16, artifacts=False)
        report = _validate(tmp_path, model, callback, items)
    finally:
        del model.generate
    assert report["count/sequences"] == 4 and len(calls) == 2
    passed = 0
    for batch_idx, call in enumerate(calls):  # oracle: each prompt row's first images, counted in its own ids
        rows = [images[2 * batch_idx + row][:int(_runs(ids[mask.bool()], image).max()) + 1]
                for row, (ids, mask) in enumerate(zip(call["input_ids"], call["attention_mask"]))]
        expected = _expected_inputs(family, rows, call, image)
        assert set(call) - {"input_ids", "attention_mask", "max_new_tokens", "do_sample", "pad_token_id"} == set(
            expected)
        for key, value in expected.items():
            assert torch.equal(call[key], value), key
        passed += sum(map(len, rows))
    assert 0 < passed < sum(map(len, images))  # the images of the generated events' screens stayed out


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_fits_its_positions_dropping_the_cut_screens_images(tmp_path, families, family):
    """A model of 160 positions (its text config's max_position_embeddings) on 160-token windows, the callback's
    defaults (issue 44 item 2): max_new_tokens 4 x 80 at most half the context, 80; each prompt is its row cut
    before the last 4 actions and from the left, at an event, to 160 - 80 tokens (`expected_prompt`, over the
    token list), and each generate call gets exactly the images of the screens left in its prompts."""
    tokenizer, config, vocab, items, images, _ = families[family]
    model = tiny_family_model(family, tokenizer, positions=160)
    assert max(len(x["input_ids"]) for x in items) > 80
    image, calls, generate = vocab.ids[FAMILIES[family][1]], [], model.generate

    def recording(*args, **kwargs):  # the real generate, its inputs kept
        calls.append(kwargs)
        return generate(*args, **kwargs)

    model.generate = recording
    report = _validate(tmp_path, model, OWAEventMetricsCallback(tokenizer, config=config, alignment="generation",
                                                                artifacts=False), items)
    assert report["count/sequences"] == 4 and len(calls) == 2
    dropped = 0
    for batch_idx, call in enumerate(calls):
        assert call["max_new_tokens"] == 80 and call["input_ids"].shape[1] + 80 <= 160
        rows = []
        for row, (ids, mask) in enumerate(zip(call["input_ids"], call["attention_mask"])):
            full = items[2 * batch_idx + row]["input_ids"]
            prompt, cut = expected_prompt(full.tolist(), vocab, 4, 160 - 80)
            assert ids[mask.bool()].tolist() == prompt
            runs = _runs(full, image)  # the screens' images: the runs of image tokens, in order
            shown = sorted(set(runs[cut - len(prompt):cut].tolist()) - {-1})
            rows.append([images[2 * batch_idx + row][k] for k in shown])
            dropped += len(set(runs[:cut - len(prompt)].tolist()) - {-1})
        expected = _expected_inputs(family, rows, call, image)
        assert set(call) - {"input_ids", "attention_mask", "max_new_tokens", "do_sample", "pad_token_id"} == set(
            expected)
        for key, value in expected.items():
            assert torch.equal(call[key], value), key
    assert dropped > 0  # screens cut from the left: their images left out


def test_a_batch_the_default_generation_cannot_cut_stops_fit_at_step_0(tmp_path, families):
    """Qwen2-VL's screens as videos (pixel_values_videos, video_grid_thw): the sanity check tries the cut and stops
    the run before any training step, naming the keys and generate_fn."""
    tokenizer, config, vocab, items, _, model = families["qwen2_vl"]
    image, video = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    clips = [{"input_ids": torch.where(x["input_ids"] == image, video, x["input_ids"]), "labels": x["labels"],
              "pixel_values_videos": x["pixel_values"], "video_grid_thw": x["image_grid_thw"],
              "mm_token_type_ids": 2 * x["mm_token_type_ids"]} for x in items]

    class Trained(VLM):
        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    callback = OWAEventMetricsCallback(tokenizer, config=config, alignment="generation", artifacts=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, callbacks=[callback],
                        default_root_dir=tmp_path)
    loader = DataLoader(clips, batch_size=2, collate_fn=collate)
    try:
        with pytest.raises(PromptInputsError, match=r"\['pixel_values_videos', 'video_grid_thw'\] belongs to each "
                                                    r"prompt.*pass generate_fn\(input_ids, attention_mask"):
            trainer.fit(Trained(model), loader, loader)
    finally:
        model.eval()
    assert trainer.global_step == 0  # stopped in the sanity check, before any training step


def test_collate_keeps_each_familys_layout():
    ids = [torch.tensor([1, 2, 3]), torch.tensor([4])]
    idefics = collate([{"input_ids": i, "pixel_values": torch.full((1, n, 3, 2, 2), float(n)),
                        "pixel_attention_mask": torch.ones(1, n, 2, 2, dtype=torch.bool)} for i, n in zip(ids, (2, 1))])
    assert idefics["pixel_values"].shape == (2, 2, 3, 2, 2)  # [B, most images, 3, H, W], zero-padded
    assert idefics["pixel_values"][:, :, 0, 0, 0].tolist() == [[2, 2], [1, 0]]
    assert idefics["pixel_attention_mask"][:, :, 0, 0].tolist() == [[True, True], [True, False]]
    qwen = collate([{"input_ids": i, "pixel_values": torch.full((4 * n, 24), float(n)), "mm_token_type_ids": (i > 1).long(),
                     "image_grid_thw": torch.tensor([[1, 2, 2]] * n)} for i, n in zip(ids, (2, 1))])
    assert qwen["pixel_values"][:, 0].tolist() == [2] * 8 + [1] * 4 and qwen["image_grid_thw"].tolist() == [[1, 2, 2]] * 3
    assert qwen["mm_token_type_ids"].tolist() == [[0, 1, 1], [1, 0, 0]]  # per token: [B, T], padded with 0


def test_collate_keeps_the_grid_integer_beside_an_item_without_screens():
    """An item without screens builds its grid from an empty list (``torch.tensor([[1, 4, 4]] * 0)``: float32);
    the batch's ``image_grid_thw`` stays the other items' int64 (the model reshapes by it), in either order."""
    shown = {"input_ids": torch.tensor([1, 2]), "image_grid_thw": torch.tensor([[1, 4, 4]]),
             "pixel_values": torch.ones(16, 24)}
    none = {"input_ids": torch.tensor([3]), "image_grid_thw": torch.tensor([[1, 4, 4]] * 0).reshape(0, 3),
            "pixel_values": torch.randn(0, 24)}
    for items in ([shown, none], [none, shown]):
        batch = collate(items)
        assert batch["image_grid_thw"].dtype == torch.int64 and batch["image_grid_thw"].tolist() == [[1, 4, 4]]
        assert batch["pixel_values"].dtype == torch.float32 and batch["pixel_values"].shape == (16, 24)


@pytest.mark.parametrize("family", ["idefics3", "qwen2_vl"])
def test_images_that_do_not_fit_their_tokens_raise(families, family):
    tokenizer, config, vocab, items, _, model = families[family]
    batch = collate(items[:2])
    if family == "qwen2_vl":  # the first image's grid says 8 patches (2 tokens), its tokens say 4
        batch["image_grid_thw"] = batch["image_grid_thw"].clone()
        batch["image_grid_thw"][0] = torch.tensor([1, 2, 4])
    else:  # row 0 has one image fewer than its tokens
        batch["pixel_attention_mask"] = batch["pixel_attention_mask"].clone()
        batch["pixel_attention_mask"][0, int(batch["pixel_attention_mask"][0].flatten(1).any(1).sum()) - 1] = False
    with pytest.raises(PromptInputsError, match=r"do not split into one run per image.*generate_fn\("):
        prompt_inputs(batch, torch.tensor([150, 150]), model.config.image_token_id)
