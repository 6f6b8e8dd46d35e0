import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from owa_metrics import CodecConfig, Event, Role, VocabMap, decode_batch
from oracles import batch_rows

TEXT = "<EVENT_START><KEYBOARD><1><2><3><65><press><EVENT_END><EVENT_START><SCREEN><0><2><9><image><EVENT_END>"


def test_built_tokenizer_round_trips_text_and_maps_roles(tokenizer, vocab):
    ids = tokenizer(TEXT)["input_ids"]
    assert len(ids) == 15 and tokenizer.decode(ids) == TEXT
    roles, values = vocab.lookup(torch.tensor(ids + [-100, 10_000]))
    assert roles.tolist() == [Role.START, Role.KEYBOARD, Role.DIGIT, Role.DIGIT, Role.DIGIT, Role.DIGIT, Role.ACTION,
                              Role.END, Role.START, Role.SCREEN, Role.DIGIT, Role.DIGIT, Role.DIGIT, Role.IMAGE,
                              Role.END, Role.IGNORED, Role.OTHER]
    assert values.tolist()[:6] == [-1, -1, 1, 2, 3, 65]


def _user_tokenizer(add_event_tokens: bool):
    """A 'user's own' tokenizer: other words first, event tokens added afterwards as OWA training does."""
    words = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "hello", "world", "<image>"])}
    backend = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    if add_event_tokens:
        tok.add_tokens(list(reversed(CodecConfig().event_tokens)) + ["<fake_token_around_image>", "<global-img>"])
    return tok


def test_any_hf_tokenizer_with_added_event_tokens_decodes_the_same(codec, vocab, tokenizer):
    user = _user_tokenizer(add_event_tokens=True)
    user_vocab = VocabMap.from_tokenizer(user)
    events = [Event(kind="mouse", timestamp_ns=1_230_000_000, dx=-3, dy=64),
              Event(kind="screen", timestamp_ns=2_000_000_000),
              Event(kind="keyboard", timestamp_ns=3_000_000_000, vk=13, action="release")]
    ours = torch.tensor([vocab.encode(events)])
    theirs = torch.tensor([user_vocab.encode(events)])
    assert not torch.equal(ours, theirs)  # different ids ...
    assert user.convert_ids_to_tokens(theirs[0].tolist()) == tokenizer.convert_ids_to_tokens(ours[0].tolist())
    a, b = batch_rows(decode_batch(ours, ours, vocab)), batch_rows(decode_batch(theirs, theirs, user_vocab))
    assert a == b and [r["target"]["dx"] for r in a] == [-3, 0, 0]  # ... the same events


def test_tokenizer_without_event_tokens_is_refused_with_the_missing_names():
    with pytest.raises(ValueError, match=r"lacks OWA event tokens \(hierarchical misses <EVENT_START>, <EVENT_END>.*add_tokens"):
        VocabMap.from_tokenizer(_user_tokenizer(add_event_tokens=False))


def test_encode_needs_the_image_tokens_for_screens():
    words = {t: i for i, t in enumerate(CodecConfig().event_tokens)}
    with pytest.raises(ValueError, match="image tokens"):
        VocabMap(words).encode([Event(kind="screen", timestamp_ns=0)])


def test_fast_tokenize_equals_the_built_tokenizer():
    """`owa_metrics.offline.streaming.tokenize` (regex split + dict) gives the offline tokenizer's ids, odd text included."""
    import numpy as np

    from owa_metrics import build_tokenizer
    from owa_metrics.offline.evaluate import tokenize

    rng = np.random.default_rng(0)
    for fmt in ("hierarchical", "factorized"):
        tokenizer = build_tokenizer(format=fmt)
        pieces = ["<EVENT_START>", "<MOUSE>", "<7>", "<VK_65>", "<SIGN_MINUS>", "<EVENT_END>", "<", ">", "<<x>",
                  "a b", " ", "<unknown>", "é", "<12", "\t", "<fake_image_placeholder>"]
        for _ in range(300):
            text = "".join(rng.choice(pieces, size=int(rng.integers(0, 12))))
            want = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tokenize(text, tokenizer.get_vocab(), tokenizer.unk_token_id) == want, repr(text)


def test_the_description_names_only_image_tokens_the_vocabulary_holds():
    from owa_metrics import OWAEventMetrics

    words = {"[PAD]": 0, "[UNK]": 1, "<|endoftext|>": 2}
    backend = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    tok.add_tokens(sorted(CodecConfig.preset("factorized").event_tokens))
    text = repr(OWAEventMetrics(tok))
    assert "factorized format" in text and "no image tokens" in text and "(-100)" in text
    assert not any(t in text for t in ("<image>", "<global-img>", "<fake_token_around_image>", "<IMG_CONTEXT>"))
    smol = _user_tokenizer(True)  # holds SmolVLM's three image tokens
    assert VocabMap.from_tokenizer(smol).describe() == ("hierarchical format, screens as <fake_token_around_image> "
                                                        "<global-img> <image> x 64 <fake_token_around_image>")
