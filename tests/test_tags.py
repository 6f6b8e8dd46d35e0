"""Slices (issue 25, item 1): each tag's keys equal the report of that tag's sequences scored alone."""

import re

import numpy as np
import pytest
import torch

from owa_metrics import OWAEventMetrics, decode_batch
from owa_metrics.callbacks import OWAEventMetricsForTrainer
from owa_metrics.events import simulate_session
from owa_metrics.functional.report import headline_keys
from metric_oracle import perturb

TAGS = ["game", "editor", "browser", "unused"]  # "unused" tags no sequence: its keys are left out


@pytest.fixture(scope="module")
def batches(vocab):
    """Three batches of (preds, target, tags, logits): simulated sequences with perturbed predictions, tagged so
    that a batch misses a tag and a tag has one sequence in a batch."""
    rng = np.random.default_rng(0)
    events = simulate_session(40, seed=7)
    chunks = [events[i:i + 24] for i in range(0, len(events), 24)][:18]
    tags = [0, 1, 0, 2, 1, 0] + [0, 0, 1, 1, 0, 1] + [2, 0, 1, 2, 2, 1]  # batch 2: no "browser" (2)
    out = []
    for first in range(0, 18, 6):
        group = chunks[first:first + 6]
        preds = [vocab.encode(perturb(c, rng)) for c in group]
        target = [vocab.encode(c, ignore_images=True) for c in group]
        width = max(map(len, preds + target))
        pad = lambda rows: torch.tensor([r + [-100] * (width - len(r)) for r in rows])  # noqa: E731
        logits = torch.randn(len(group), width, vocab.size, generator=torch.Generator().manual_seed(first))
        out.append((pad(preds), pad(target), torch.tensor(tags[first:first + 6]), logits, group))
    return out


def _report(metric):
    return {k: float(v) for k, v in metric.compute().items()}


def _assert_same(got: dict, expected: dict, where: str) -> None:
    assert got.keys() == expected.keys(), (where, sorted(got.keys() ^ expected.keys()))
    for key, value in expected.items():  # counts exactly; floats to 1e-12 (the same rows, the same arithmetic; a
        exact = key.startswith(("count/", "status/")) and not key.endswith("_rate")  # D2E scale ratio may be inf)
        assert got[key] == value if exact else got[key] == value or abs(got[key] - value) <= 1e-12 * max(
            1, abs(value)), (where, key)


CASES = [  # alignment, pairing, mode, backend
    ("teacher_forcing", "index", "exact", "auto"),  # the compiled CPU path, with the token loss
    ("teacher_forcing", "index", "sketch", "torch"),
    ("generation", "index", "exact", "torch"),
    ("generation", "index", "sketch", "auto"),
    ("generation", "time", "exact", "auto"),  # detection counts and their samples per tag
    ("generation", "time", "sketch", "auto"),
]


@pytest.mark.parametrize("alignment, pairing, mode, backend", CASES)
def test_each_tags_keys_equal_its_sequences_scored_alone(tokenizer, batches, alignment, pairing, mode, backend):
    settings = dict(alignment=alignment, pairing=pairing, mode=mode, backend=backend)
    tagged = OWAEventMetrics(tokenizer, tags=TAGS, tag_keys="all", **settings)
    pooled = OWAEventMetrics(tokenizer, **settings)
    alone = [OWAEventMetrics(tokenizer, **settings) for _ in TAGS]  # the oracle: a metric fed one tag's sequences
    for preds, target, tags, logits, _ in batches:
        loss = {"logits": logits} if alignment == "teacher_forcing" else {}
        # time pairing: one origin per sequence given as a list / numpy array (not a tensor), sliced per tag too
        origins = [5_000_000 * k for k in range(len(target))] if pairing == "time" else None
        origin = {"origin_ns": origins if mode == "exact" else np.array(origins)} if origins else {}
        tagged.update(preds, target, tags=tags, **loss, **origin)
        pooled.update(preds, target, **loss, **origin)
        for t, metric in enumerate(alone):
            rows = (tags == t).nonzero()[:, 0]
            if len(rows):
                metric.update(preds[rows], target[rows], **{k: v[rows] for k, v in loss.items()},
                              **({"origin_ns": [origins[r] for r in rows]} if origins else {}))
    got = _report(tagged)
    _assert_same({k: v for k, v in got.items() if not k.startswith("tag/")}, _report(pooled), "pooled")
    for name, metric in zip(TAGS[:3], alone):
        _assert_same({k[len(f"tag/{name}/"):]: v for k, v in got.items() if k.startswith(f"tag/{name}/")},
                     _report(metric), name)
    assert not any(k.startswith("tag/unused/") for k in got)
    if alignment == "teacher_forcing":
        assert got["tag/game/mouse_nop/loss"] > 0
    if pairing == "time":
        assert 0 < got["tag/editor/detect/f1"] < 1


def test_tag_counts_by_hand_and_the_default_keys(tokenizer, batches):
    """Counted by hand from the event lists: sequences and target events per tag; the default keys are those two
    counts and the headline keys."""
    metric, every = (OWAEventMetrics(tokenizer, tags=TAGS, alignment="generation", tag_keys=keys, generated_screens="scored")
                     for keys in (None, "all"))
    for preds, target, tags, _, _ in batches:
        metric.update(preds, target, tags=[TAGS[t] for t in tags.tolist()])  # names work as ids do
        every.update(preds, target, tags=tags)
    got, all_keys = _report(metric), _report(every)
    for t, name in enumerate(TAGS[:3]):
        chunks = [c for *_, tags, _, group in batches for c, tag in zip(group, tags.tolist()) if tag == t]
        assert got[f"tag/{name}/count/sequences"] == len(chunks)
        assert got[f"tag/{name}/count/target_events"] == sum(map(len, chunks))
        keys, tag = ({k[len(f"tag/{name}/"):]: v for k, v in r.items() if k.startswith(f"tag/{name}/")}
                     for r in (got, all_keys))
        sizes = ("count/sequences", "count/target_events")
        assert keys == {k: v for k, v in tag.items() if k in headline_keys("generation") or k in sizes}
        assert "comparable_rate" in keys and "count_accuracy" in keys
    assert sum(got[f"tag/{name}/count/target_events"] for name in TAGS[:3]) == got["count/target_events"]


def test_forward_and_state_dict_carry_the_tags(tokenizer, batches):
    preds, target, tags, _, _ = batches[0]
    metric = OWAEventMetrics(tokenizer, tags=TAGS, alignment="generation", persistent=True)
    step = {k: float(v) for k, v in metric(preds, target, tags=tags).items()}  # forward: that batch's report
    alone = OWAEventMetrics(tokenizer, alignment="generation")
    rows = (tags == 1).nonzero()[:, 0]
    alone.update(preds[rows], target[rows])
    assert step["tag/editor/count/target_events"] == _report(alone)["count/target_events"]
    metric.update(*batches[1][:2], tags=batches[1][2])
    loaded = OWAEventMetrics(tokenizer, tags=TAGS, alignment="generation", persistent=True)
    loaded.load_state_dict(metric.state_dict())
    assert _report(loaded) == _report(metric)
    assert _report(metric)["tag/editor/count/sequences"] == int((batches[0][2] == 1).sum() + (batches[1][2] == 1).sum())


def test_misuse_raises_saying_what_to_do(tokenizer, batches):
    preds, target, tags, _, _ = batches[0]
    for bad, says in ((["a", "a"], "distinct"), (["a/b"], "without '/'"), ("game", "list of names"),
                      ([f"t{i}" for i in range(65)], "at most 64")):
        with pytest.raises(ValueError, match=says):
            OWAEventMetrics(tokenizer, tags=bad)
    for bad_keys in ("headline", []):  # [] would report nothing per tag
        with pytest.raises(ValueError, match="tag_keys must be"):
            OWAEventMetrics(tokenizer, tags=TAGS, tag_keys=bad_keys)
    metric = OWAEventMetrics(tokenizer, tags=TAGS)
    for bad, says in ((None, "pass update"), (tags + 4, r"in \[0, 4\)"), (tags[:3], "must be 6 integer ids"),
                      (tags.float(), "integer ids"), (["game"] * 5 + ["chess"], r"\['chess'\] are not among"),
                      (["game"] * 5 + [1], "integer ids")):
        with pytest.raises(ValueError, match=says):
            metric.update(preds, target, tags=bad)
    assert float(metric.compute()["count/target_events"]) == 0  # nothing was added by a refused update
    with pytest.raises(ValueError, match="needs the tags' names up front"):
        OWAEventMetrics(tokenizer).update(preds, target, tags=tags)
    with pytest.raises(ValueError, match="no tag per sequence"):
        OWAEventMetricsForTrainer(tokenizer, tags=TAGS)
    with pytest.raises(ValueError, match="slice the token ids"):
        metric.update(decode_batch(preds, target, metric.vocab))
    misspelt = OWAEventMetrics(tokenizer, tags=TAGS, tag_keys=["comparable_rate", "comparable_rat"])
    misspelt.update(preds, target, tags=tags)
    with pytest.warns(UserWarning, match=r"tag_keys names \['comparable_rat'\]"):
        got = _report(misspelt)
    assert {k for k in got if k.startswith("tag/game/")} == {"tag/game/comparable_rate"}


MORE = [  # alignment, pairing, mode, backend, settings: the D2E states, the token loss given, a tolerance sweep
    ("teacher_forcing", "index", "exact", "torch", {"bin_ms": 50, "bin_shifts": (-1, 1)}),
    ("teacher_forcing", "index", "sketch", "auto", {"bin_ms": 50}),
    ("generation", "index", "exact", "auto", {"bin_ms": 50, "generated_screens": "scored"}),
    ("generation", "time", "exact", "torch", {"tolerance_ms": (50, 200), "bin_ms": 50, "bin_shifts": (1,)}),
    ("generation", "time", "sketch", "auto", {"tolerance_ms": (50, 200)}),
]


@pytest.mark.parametrize("alignment, pairing, mode, backend, more", MORE)
def test_d2e_sweep_and_given_loss_per_tag_equal_its_sequences_scored_alone(tokenizer, batches, alignment, pairing,
                                                                           mode, backend, more):
    """Issue 34: the tag is an axis of every state, the D2E sums, the detection sweep and the skipped loss tokens
    included; each tag's keys still equal a metric fed only its sequences."""
    settings = dict(alignment=alignment, pairing=pairing, mode=mode, backend=backend, **more)
    tagged = OWAEventMetrics(tokenizer, tags=TAGS, tag_keys="all", **settings)
    pooled = OWAEventMetrics(tokenizer, **settings)
    alone = [OWAEventMetrics(tokenizer, **settings) for _ in TAGS]
    g = torch.Generator().manual_seed(3)
    for preds, target, tags, _, _ in batches:
        loss = {}
        if alignment == "teacher_forcing":  # a per-token loss with non-finite values at some labelled positions
            token_loss = torch.rand(target.shape, generator=g) * 3
            token_loss[torch.rand(target.shape, generator=g) < 0.02] = float("nan")
            loss = {"token_loss": token_loss}
        tagged.update(preds, target, tags=tags, **loss)
        pooled.update(preds, target, **loss)
        for t, metric in enumerate(alone):
            rows = (tags == t).nonzero()[:, 0]
            if len(rows):
                metric.update(preds[rows], target[rows], **{k: v[rows] for k, v in loss.items()})
    got = _report(tagged)
    _assert_same({k: v for k, v in got.items() if not k.startswith("tag/")}, _report(pooled), "pooled")
    for name, metric in zip(TAGS[:3], alone):
        _assert_same({k[len(f"tag/{name}/"):]: v for k, v in got.items() if k.startswith(f"tag/{name}/")},
                     _report(metric), name)
    if "bin_ms" in more:
        assert got["tag/game/d2e/num_bins"] > 0
    if alignment == "teacher_forcing":
        assert got["count/loss_skipped_tokens"] == sum(got[f"tag/{n}/count/loss_skipped_tokens"] for n in TAGS[:3]) > 0
    if "tolerance_ms" in more:
        assert 0 < got["tag/editor/detect/f1_within_50ms"] <= got["tag/editor/detect/f1_within_200ms"] <= 1


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_an_update_with_tags_decodes_once(tokenizer, batches, backend, monkeypatch):
    """One decode per update whatever the number of tags (issue 34: the tags' rows are not decoded again)."""
    import owa_metrics.metrics.collection as collection

    calls = []
    for name in ("decode_batch", "kernel_arrays"):
        real = getattr(collection, name)
        monkeypatch.setattr(collection, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    metric = OWAEventMetrics(tokenizer, tags=TAGS, backend=backend)
    preds, target, tags, _, _ = batches[0]
    metric.update(preds, target, tags=tags)
    assert len(calls) == 1 and metric.compute()["tag/game/count/sequences"] == int((tags == 0).sum())


def test_a_declared_given_state_without_the_tag_axis_is_refused(tokenizer, batches):
    """A registered `Given` / `GivenSamples` state that gives pooled sums (or values without their sequences) would add
    them to every tag: with tags the update refuses it, saying what to return."""
    from owa_metrics.functional.declare import Definition, Given, GivenSamples
    from owa_metrics.functional.report import register, unregister

    preds, target, tags, _, _ = batches[0]
    for name, state, says in (("pooled_given", Given((1,), lambda batch, x: (torch.ones(1, dtype=torch.float64),)),
                               "without the tag axis"),
                              ("bare_samples", GivenSamples(lambda batch, x: torch.ones(3, dtype=torch.float64)),
                               "without their sequences")):
        register(Definition(name, lambda s, state=state: {f"{name}_state": state}, lambda r: {}))
        try:
            OWAEventMetrics(tokenizer).update(preds, target)  # without tags: as before
            with pytest.raises(ValueError, match=says):
                OWAEventMetrics(tokenizer, tags=TAGS).update(preds, target, tags=tags)
        finally:
            unregister(name)


@pytest.mark.parametrize("alignment", ["teacher_forcing", "generation"])
def test_the_tag_axis_is_the_same_on_the_kernel_and_the_torch_path(tokenizer, batches, alignment):
    """Every state by tag (exact and sketch, D2E on), after the same batches: the compiled loop and the torch ops."""
    for mode in ("exact", "sketch"):
        metrics = [OWAEventMetrics(tokenizer, alignment=alignment, mode=mode, backend=b, tags=TAGS, bin_ms=50)
                   for b in ("kernel", "torch")]
        for preds, target, tags, logits, _ in batches:
            loss = {"logits": logits} if alignment == "teacher_forcing" else {}
            for m in metrics:
                m.update(preds, target, tags=tags, **loss)
        for name in metrics[0]._defaults:
            got, want = (getattr(m, name) for m in metrics)
            if isinstance(got, list):
                got, want = torch.cat(got), torch.cat(want)
            # counts exactly; the per-sequence means, the direction error (atan2) and the loss to the last bits
            torch.testing.assert_close(got, want, rtol=1e-12, atol=0, equal_nan=True, msg=f"{mode} {name}")
        assert metrics[0].timestamp_digits.shape[0] == len(TAGS)


MLFLOW_NAME = re.compile(r"[A-Za-z0-9_\-./: ]+")  # issue 44 item 3: the characters MLflow keeps in a metric name


@pytest.mark.parametrize("settings", [
    {"bin_ms": 50, "bin_shifts": (-2, 0, 2)},
    {"alignment": "generation", "pairing": "time", "tolerance_ms": (50, 12.5), "bin_ms": 50, "bin_shifts": (-1, 1)}])
def test_every_key_is_a_name_every_logger_keeps(tokenizer, batches, settings):
    """Every key of a report with tags, a sweep and D2E shifts, and its charted name, passes MLflow's own metric
    name check as produced (no logger rewrites it): no ``@`` or ``+`` in the sweep and shift keys."""
    from mlflow.utils.validation import _validate_metric_name

    from owa_metrics.callbacks.artifacts import breakdown_name

    metric = OWAEventMetrics(tokenizer, tags=TAGS, tag_keys="all", num_resamples=20, **settings)
    for preds, target, tags, logits, _ in batches:
        metric.update(preds, target, tags=tags, **({} if "pairing" in settings else {"logits": logits}))
    keys = list(metric.compute())
    shifted = [k for k in keys if "_shift_" in k]
    assert {"d2e/keyboard/key_accuracy_shift_-2bins" if -2 in settings["bin_shifts"] else
            "tag/game/d2e/num_bins_shift_1bins"} <= set(shifted) and "d2e/best_shift_bins" in keys
    if "tolerance_ms" in settings:
        assert {"detect/f1_within_50ms", "detect/f1_within_12.5ms", "tag/game/detect/f1_within_12.5ms"} <= set(keys)
    for key in keys + [breakdown_name(k, "val/owa/") for k in keys]:
        assert MLFLOW_NAME.fullmatch(key), key
        _validate_metric_name(key)
