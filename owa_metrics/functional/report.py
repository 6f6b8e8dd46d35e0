"""The report's metrics, each declared once (`owa_metrics.functional.declare`): the states it reads, then its keys.

``REPORT`` is what `OWAEventMetrics` computes, in order; `register` adds a definition to it (a key family of your
own: docs/METRICS.md, "Adding a metric"). Each ``compute`` reads its states by name from ``r`` (`Read`): ``r["name"]``
(a `Sums` state's values by name, each over its groups), ``r.samples(name, value, category)`` (a `Distribution`).
"""

from __future__ import annotations

import fnmatch
import functools

import torch

from ..decode.matching import _detection_counts
from ..schema import CATEGORY_NAMES, Status
from .declare import (
    ONE, SUM_PARTS, BatchCounts, Definition, Given, GivenSamples, Samples, SequenceMean, Shape, Sums, Value, code_is,
    digit_prefix, error, exact_total, ms, same, true, within,
)
from . import d2e, sequences, values
from .events import detection_report, event_type_report, keyboard_report, mouse_action_report, movement_r2_report, ratio
from .plan import Plan, accumulate
from .tokens import TOKEN_FIELDS, token_report

N_CAT = len(CATEGORY_NAMES)
TIMESTAMP_GROUPS = ("comparable", *(f"comparable_{c}" for c in CATEGORY_NAMES))  # all, then each category


# ------------------------------------------------------------------ comparability, categories, counts, statuses
def _event_states(s: Shape) -> dict:
    return {
        "confusion": Sums(tuple(f"valid_{c}" for c in CATEGORY_NAMES),  # true category x predicted column (+ invalid)
                          {f"pred_{k}": code_is("pred_column", k) for k in range(N_CAT + 1)}),
        "statuses": Sums(("all",), {st.label: code_is("status", st) for st in Status}),
        "target_statuses": Sums(("all",), {st.label: code_is("target_status", st) for st in Status}),
        "events": Sums(("all",), {"events": ONE}),
        "batch_counts": BatchCounts(),
        "comparable_seq": SequenceMean("valid", code_is("status", Status.VALID)),
    }


# keys that say something only when the predicted events are generated: under teacher forcing every target event
# has exactly one prediction, so these would be constants (count_accuracy 1, pred_events = target_events, 0, 0, 0)
GENERATION_ONLY = ("count_accuracy", "count/pred_events", "count/extra_events", "count/missing_events",
                   "status/missing")


# A key's words wherever it is shown in words (the demo's table, the markdown report's headline, docs/METRICS.md's
# table of names, which a test holds equal to this): written here only, read by all of them.
WORDS = {
    "comparable_rate": "comparable events",
    "count_accuracy": "event count right (per sequence)",
    "category/macro_f1": "category macro F1",
    "detect/f1": "detection F1 (time pairing)",
    "mouse/click_offset_p50_mu": "cursor offset at true clicks P50 (raw mouse units)",
    "keyboard/sequence_error_rate": "key-sequence error rate (edit distance / true keys)",
    "timestamp/abs_error_p95_ms": "timestamp abs error P95",
    "timestamp/signed_error_iqm_ms": "timestamp signed error IQM",
    "mouse/euclidean_iqmpe_pct": "mouse euclidean error IQM",
    "mouse/euclidean_pe_p95_pct": "mouse euclidean error P95",
    "mouse/direction_error_p50_deg": "mouse direction error P50",
    "mouse/direction_error_p95_deg": "mouse direction error P95",
    "mouse/action_accuracy": "mouse button accuracy",
    "keyboard/accuracy": "keyboard accuracy (vk and action)",
    "token_accuracy/timestamp": "timestamp tokens right",
    **{f"{cat}/loss": f"{cat} loss per event" for cat in CATEGORY_NAMES},
}
# the report's headline, what a reader sees first (the markdown report, TensorBoard's ``val`` group, the per-tag keys):
# (key, words, unit, the only alignment it applies to or None)
HEADLINE = tuple((key, WORDS[key], unit, only) for key, unit, only in (
    ("comparable_rate", "ratio", None),
    ("count_accuracy", "ratio", "generation"),
    ("category/macro_f1", "ratio", None),
    ("detect/f1", "ratio", "generation"),
    ("mouse/click_offset_p50_mu", "mu", "generation"),
    ("keyboard/sequence_error_rate", "ratio", "generation"),
    ("timestamp/abs_error_p95_ms", "ms", None),
    ("timestamp/signed_error_iqm_ms", "ms", None),
    ("mouse/euclidean_iqmpe_pct", "%", None),
    ("mouse/euclidean_pe_p95_pct", "%", None),
    ("mouse/direction_error_p50_deg", "deg", None),
    ("mouse/direction_error_p95_deg", "deg", None),
    ("mouse/action_accuracy", "ratio", None),
    ("keyboard/accuracy", "ratio", None),
    ("token_accuracy/timestamp", "ratio", "teacher_forcing"),
))
# which way a key is better, by pattern (fnmatch, the first match wins; a tag's key as the key itself): True higher,
# False lower, None neither (counts, shares, signed errors, whose best is 0); `higher_is_better` reads it
BETTER = (("d2e/*sample_count*", None), ("d2e/num_bins*", None), ("d2e/duration_s", None),
          ("d2e/best_shift_bins", None), ("d2e/*pearson*", True), ("d2e/*scale_ratio*", False),
          ("d2e/*false_positive_rate*", False), ("count_accuracy", True), ("status/*_rate", False),
          ("*sequence_error_rate", False), ("*signed*", None),
          ("count/*", None), ("status/*", None), ("*/count", None), ("*/ratio", None), ("*_rate*", True),
          ("*accuracy*", True), ("*f1*", True), ("*precision*", True), ("*recall*", True), ("*r2*", True),
          ("*cosine*", True), ("*coverage", True), ("*error*", False), ("*iqmpe*", False), ("*_pe_*", False),
          ("*offset*", False), ("*/loss", False), ("*/loss_sum", False))


def higher_is_better(key: str):
    """True when a higher value of ``key`` is better, False when a lower one is, None when neither (`BETTER`)."""
    if key.startswith("tag/"):
        key = key.split("/", 2)[2]
    return next((better for pattern, better in BETTER if fnmatch.fnmatchcase(key, pattern)), None)


# keys that a few tiny true moves dominate (a percent of the true value, a sum of squares): the spec's, kept in the
# report, but no headline chart; their robust neighbours are mouse/euclidean_iqmpe_pct and the direction error
TINY_MOVE_KEYS = ("mouse/euclidean_pe_p95_pct", "mouse/r2")


def headline_keys(alignment: str) -> list[str]:
    """The keys charted first (TensorBoard's ``val`` group): `HEADLINE`'s that apply to ``alignment``, without
    `TINY_MOVE_KEYS`."""
    return [key for key, _, _, only in HEADLINE if only in (None, alignment) and key not in TINY_MOVE_KEYS]


def default_tag_keys(alignment: str) -> list[str]:
    """The keys each tag reports by default (`OWAEventMetrics`' ``tags``): its size, then `headline_keys`."""
    return ["count/sequences", "count/target_events", *headline_keys(alignment)]


def _event_keys(r) -> dict:
    counts = torch.cat([r["events"].events.reshape(1), r["batch_counts"].raw, r["comparable_seq"].raw])
    out = event_type_report(r["confusion"].raw, r["statuses"].raw[0], counts)
    return {k: v for k, v in out.items() if r.alignment != "teacher_forcing" or k not in GENERATION_ONLY}


EVENTS = Definition("events", _event_states, _event_keys)


def event_type_sums(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(confusion [4, 5], status counts, EVENT_COUNTS)`` of one `EventBatch`, from `EVENTS`' declared states
    (`EventTypeMetrics`' twin)."""
    digits = batch.target.digits.shape[1] - batch.target.n_timestamp_digits
    plan = Plan.get((EVENTS,), Shape(batch.target.n_timestamp_digits, digits // 2, 1), batch.seq_idx.device, ())
    got = {name: v[0] for name, v in zip(plan.sums_states, accumulate(plan, batch)[0])}  # the one group
    return got["confusion"].view(N_CAT, N_CAT + 1), got["statuses"], torch.cat(
        [got["events"], got["batch_counts"].double(), got["comparable_seq"]])


# ------------------------------------------------------------------ timestamps
def _timestamp_states(s: Shape) -> dict:
    return {
        "timestamp_digits": Sums(TIMESTAMP_GROUPS, {**{f"p{j + 1}": digit_prefix("timestamp", j)
                                                       for j in range(s.n_timestamp_digits)}, "events": ONE}),
        "timestamp": Samples("comparable", {"signed_error_ms": values.TIMESTAMP_ERROR_MS,
                                            "percent_error": values.TIMESTAMP_PERCENT}, by_category=True),
    }


def _timestamp_keys(r) -> dict:
    out, digits = {}, r["timestamp_digits"]
    for g, group in enumerate(("all", *CATEGORY_NAMES)):
        prefix = "timestamp" if group == "all" else f"{group}/timestamp"
        category = None if group == "all" else g - 1
        signed = r.samples("timestamp", "signed_error_ms", category)
        low, high = signed.iqm_ci(r.num_resamples, r.seed)
        out[f"{prefix}/abs_error_p95_ms"] = signed.abs().quantile(0.95)
        out[f"{prefix}/signed_error_iqm_ms"] = signed.iqm()
        out[f"{prefix}/signed_error_ci_low_ms"], out[f"{prefix}/signed_error_ci_high_ms"] = low, high
        out[f"{prefix}/iqmpe_pct"] = r.samples("timestamp", "percent_error", category).iqm()
        out.update({f"{prefix}/precision_{name}": ratio(getattr(digits, name)[g], digits.events[g])
                    for name in digits.names if name != "events"})
    return out


TIMESTAMP = Definition("timestamp", _timestamp_states, _timestamp_keys)


# ------------------------------------------------------------------ timestamps: upstream OWA evaluator's parity keys
def _timestamp_r2_states(s: Shape) -> dict:
    # in ms (R² has no unit): on a format's grid of whole ms (10 ms by default) integers, whose squares and sums are
    # exact in float64 (squared ns pass 2^53: their sums would round, differently in another order of batches)
    e, t = values.TIMESTAMP_ERROR_MS, ms(true("timestamp_ns"))
    return {"timestamp_r2": Sums(TIMESTAMP_GROUPS, {"squared_error": e * e, "true": t, "true_squared": t * t,
                                                    "events": ONE})}


def _timestamp_r2_keys(r) -> dict:
    """``{group}/timestamp/r2`` = 1 - sum(e²) / sum((t - mean t)²) (e: the wrap-aware error, t: the true timestamp
    in the window; left out when the denominator is 0); the ladder of |e| quantiles P0 .. P100 (ms)."""
    s = r["timestamp_r2"]
    total = s.true_squared - s.true * s.true / s.events.clamp(min=1)
    r2 = ratio(total - s.squared_error, torch.where(total > 0, total, 0))
    out = {("timestamp" if g == 0 else f"{CATEGORY_NAMES[g - 1]}/timestamp") + "/r2": r2[g] for g in range(len(r2))}
    ladder = r.samples("timestamp", "signed_error_ms").abs().quantile([0.0, 0.25, 0.5, 0.75, 1.0])
    out.update({f"timestamp/abs_error_p{q}_ms": v for q, v in zip((0, 25, 50, 75, 100), ladder)})
    return out


TIMESTAMP_R2 = Definition("timestamp_r2", _timestamp_r2_states, _timestamp_r2_keys)


# ------------------------------------------------------------------ keyboard
def _keyboard_states(s: Shape) -> dict:
    return {"keyboard": Sums(("comparable_keyboard",), values.KEYBOARD),
            "keyboard_seq": SequenceMean("comparable_keyboard", values.KEYBOARD_BOTH)}


def _keyboard_keys(r) -> dict:
    k = r["keyboard"]
    sums = torch.stack([k.vk_right, k.action_right, k.both_right, k.events, *r["keyboard_seq"].raw])
    return {f"keyboard/{name}": v for name, v in keyboard_report(sums).items()}


KEYBOARD = Definition("keyboard", _keyboard_states, _keyboard_keys)


# ------------------------------------------------------------------ mouse
def _mouse_states(s: Shape) -> dict:
    axes = (("dx", ("dx",)), ("dy", ("dy",)), ("euclidean", ("dx", "dy")))  # the euclidean level: both match
    digits = {f"{name}_p{j + 1}": digit_prefix(fields[0], j, *fields[1:]) for name, fields in axes
              for j in range(s.n_delta_digits)}
    return {
        "mouse_action": Sums(("comparable_mouse",), values.MOUSE_ACTION),
        "movement": Sums(("comparable_mouse",), values.MOVEMENT),
        "mouse_digits": Sums(("comparable_mouse",), {**digits, "events": ONE}),
        "mouse": Samples("comparable_mouse", {
            "euclidean_pe": values.EUCLIDEAN_PERCENT, "signed_pe_x": values.SIGNED_PERCENT_X,
            "signed_pe_y": values.SIGNED_PERCENT_Y, "direction_deg": values.DIRECTION_DEG}),
    }


def _mouse_keys(r) -> dict:
    a, m, d = r["mouse_action"], r["movement"], r["mouse_digits"]
    out = {f"mouse/{k}": v for k, v in mouse_action_report(
        torch.stack([a.flags_right, a.with_flags, a.scroll_right, a.with_scroll])).items()}
    euclidean = r.samples("mouse", "euclidean_pe")
    out["mouse/euclidean_pe_p95_pct"], out["mouse/euclidean_iqmpe_pct"] = euclidean.quantile(0.95), euclidean.iqm()
    for axis in ("x", "y"):
        dist = r.samples("mouse", f"signed_pe_{axis}")
        low, high = dist.iqm_ci(r.num_resamples, r.seed)
        out[f"mouse/signed_pe_{axis}_iqm_pct"] = dist.iqm()
        out[f"mouse/signed_pe_{axis}_ci_low_pct"], out[f"mouse/signed_pe_{axis}_ci_high_pct"] = low, high
        out[f"mouse/d{axis}_iqmpe_pct"] = dist.abs().iqm()
    p50, p95 = r.samples("mouse", "direction_deg").quantile([0.5, 0.95])
    out["mouse/direction_error_p50_deg"], out["mouse/direction_error_p95_deg"] = p50, p95
    out.update({f"mouse/{name.replace('_p', '_precision_p')}": ratio(getattr(d, name), d.events)
                for name in d.names if name != "events"})
    out["mouse/r2"] = movement_r2_report(torch.stack([m.residual, m.gx, m.gy, m.gx2, m.gy2, m.events]))
    return out


MOUSE = Definition("mouse", _mouse_states, _mouse_keys)


# ------------------------------------------------------------------ tokens (teacher forcing)
def _token_pieces(batch, extras) -> tuple:
    """The summed token loss per category (the undecoded targets' column left out), and the skipped tokens."""
    stats, group = extras["tokens"], extras.get("group")
    if group is None:
        by_category = torch.zeros(N_CAT + 1, dtype=torch.float64, device=stats.category.device).index_add_(
            0, stats.category, stats.loss_sum)  # in row order
        return by_category[:N_CAT], stats.loss_skipped
    cell = stats.category + group.index_select(0, batch.seq_idx) * (N_CAT + 1)  # by group: [groups, N_CAT + 1]
    by_category = torch.zeros(extras["groups"] * (N_CAT + 1), dtype=torch.float64, device=cell.device).index_add_(
        0, cell, stats.loss_sum).view(-1, N_CAT + 1)
    return by_category[:, :N_CAT], stats.loss_skipped


def _token_states(s: Shape) -> dict:
    return {"token_fields": Given((2, len(TOKEN_FIELDS)),  # right, total per field
                                  lambda batch, x: (x["tokens"].field_correct, x["tokens"].field_total), ((0,), (1,))),
            "token_loss": Given((N_CAT + 1,), _token_pieces, ((slice(0, N_CAT),), (N_CAT,))),  # per category, skipped
            "token_loss_events": Sums(tuple(f"valid_{c}" for c in CATEGORY_NAMES), {"events": ONE}, when="token_loss")}


def _token_keys(r) -> dict:
    events = r["token_loss_events"].events
    events = torch.cat([events, events.new_zeros(1)])
    return token_report(r.given("token_fields"), torch.stack([r.given("token_loss"), events]))


TOKENS = Definition("tokens", _token_states, _token_keys, alignment="teacher_forcing")


# ------------------------------------------------------------------ detection (generation, time pairing)
def _detection_by_group(batch, extras: dict) -> torch.Tensor:
    """[groups, tolerances, 3, N_CAT + 1]: the detection counts (at each tolerance of a sweep) by group of sequences
    (``extras["group"]``), each target and generated event in its sequence's group; once per update."""
    if "detection_by_group" not in extras:
        tm, group = batch.time_matching, extras["group"]
        detection = tm.sweep_detection if tm.sweep_detection is not None else tm.detection[None]
        extras["detection_by_group"] = _detection_counts(
            batch.target, batch.generated, batch.target.status == int(Status.VALID), detection,
            group.index_select(0, batch.seq_idx), group.index_select(0, batch.generated_seq.long()), extras["groups"])
    return extras["detection_by_group"]


def _detection_states(s: Shape) -> dict:
    return {"detection": Given((3, N_CAT + 1), lambda batch, x: (
                batch.time_matching.detection_counts if x.get("group") is None else _detection_by_group(batch, x)[:, 0],)),
            "detection_errors": GivenSamples(lambda batch, x: (batch.time_matching.detection_error_ms, None if x.get(
                "group") is None else batch.seq_idx))}  # one per target event, NaN: none detected


def _detection_keys(r) -> dict:
    counts = r.given("detection")
    out = detection_report(counts)
    out["count/invalid_pred_events"] = counts[1, N_CAT]
    out["detect/time_error_abs_p50_ms"] = r.given_samples("detection_errors").quantile(0.5)
    return out


DETECTION = Definition("detection", _detection_states, _detection_keys, alignment="generation", pairing="time")


# ------------------------------------------------------------------ what a generated sequence does (generation)
def _sequence_states(s: Shape) -> dict:
    return {"click_offsets": GivenSamples(lambda batch, x: (sequences.cursor_offsets(batch, x)[0], batch.seq_idx)),
            "path_end_offsets": GivenSamples(lambda batch, x: (sequences.cursor_offsets(batch, x)[1], None if x.get(
                "group") is None else torch.arange(batch.num_sequences, device=batch.seq_idx.device))),
            "key_sequences": Given((4,), lambda batch, x: (sequences.key_sequence_sums(batch, x),))}


def _sequence_keys(r) -> dict:
    """Cursor offsets d = |P_gen - P_true| (raw mouse units): P50 / P95 at the true button-down events, P50 at the
    rows' last true events; keys: sum of Levenshtein distances / sum of true lengths, and the rows typed exactly."""
    clicks, ends = r.given_samples("click_offsets"), r.given_samples("path_end_offsets")
    p50, p95 = clicks.quantile([0.5, 0.95])
    distance, length, exact, rows = r.given("key_sequences")
    return {"mouse/click_offset_p50_mu": p50, "mouse/click_offset_p95_mu": p95,
            "mouse/path_end_offset_p50_mu": ends.quantile(0.5), "count/click_events": clicks.count,
            "count/path_rows": ends.count, "keyboard/sequence_error_rate": ratio(distance, length),
            "keyboard/sequence_exact_rate": ratio(exact, rows), "count/keyboard_sequence_rows": rows}


SEQUENCES = Definition("sequences", _sequence_states, _sequence_keys, alignment="generation")


def _moves_states(s: Shape) -> dict:
    return {"moves_with_misses": Given((7 + SUM_PARTS,), lambda batch, x: (sequences.movement_with_misses_sums(batch, x),))}


def _moves_keys(r) -> dict:
    """Over true moves ((dx, dy) != 0), an unpaired one predicted as (0, 0): R², mean cosine, paired / all."""
    m = r.given("moves_with_misses")
    return {"mouse/r2_with_misses": movement_r2_report(m[:6]),
            "mouse/cosine_with_misses": ratio(exact_total(m[6:6 + SUM_PARTS]), m[5]),
            "mouse/move_coverage": ratio(m[6 + SUM_PARTS], m[5]), "count/move_events": m[5]}


MOVES_WITH_MISSES = Definition("moves_with_misses", _moves_states, _moves_keys, alignment="generation",
                               pairing="time")


# ------------------------------------------------------------------ detection over a tolerance sweep
def ms_label(tolerance_ms: float) -> str:
    """A tolerance as keys name it: ``50``, ``12.5`` (no trailing ``.0``)."""
    return str(int(tolerance_ms)) if float(tolerance_ms).is_integer() else str(float(tolerance_ms))


def _sweep_states(s: Shape) -> dict:
    return {"detection_sweep": Given((len(s.tolerances_ms), 3, N_CAT + 1),
                                     lambda batch, x: (batch.time_matching.sweep_counts if x.get("group") is None else
                                                       _detection_by_group(batch, x),))} if s.tolerances_ms else {}


def _sweep_keys(r) -> dict:
    """At each tolerance t of the sweep: ``detect/{f1,precision,recall}_within_{t}ms`` and ``detect/{cat}/f1_within_{t}ms``
    (`detection_report` of the counts at t); ``detect/f1_mean``: the mean of the micro F1 over the tolerances."""
    sweep, out, f1 = r.plan.shape.tolerances_ms, {}, []
    for t, counts in zip(sweep, r.given("detection_sweep") if sweep else ()):
        at = detection_report(counts)
        out.update({f"{k}_within_{ms_label(t)}ms": v for k, v in at.items()
                    if k.endswith("/f1") or k in ("detect/precision", "detect/recall")})
        f1 += [at["detect/f1"]] if "detect/f1" in at else []
    if f1:
        out["detect/f1_mean"] = torch.stack(f1).mean()
    return out


DETECTION_SWEEP = Definition("detection_sweep", _sweep_states, _sweep_keys, alignment="generation", pairing="time")


# ------------------------------------------------------------------ the D2E protocol (binned, `functional.d2e`)
def _d2e_states(s: Shape) -> dict:
    if s.bin_ms is None:
        return {}
    rows = len(d2e.shift_rows(s.bin_shifts))
    return {"d2e": Given((rows, len(d2e.STATES)),
                         lambda batch, x: (d2e.batch_states(batch, s.window_ns, s.bin_ms, s.bin_shifts, x.get("group"),
                                                            x.get("groups", 1), x.get("host_reads", False)),))}


def _d2e_keys(r) -> dict:
    """Upstream's binned keys ``d2e/...`` over each sequence's range (`d2e.batch_events`), from the summed states."""
    s = r.plan.shape
    return {} if s.bin_ms is None else d2e.d2e_keys(r.given("d2e"), s.empty_bins_as_correct,
                                                    d2e.shift_rows(s.bin_shifts))


D2E = Definition("d2e", _d2e_states, _d2e_keys)


# ------------------------------------------------------------------ key groups, mouse ops
# Windows virtual-key groups of the true vk (inclusive ranges); a vk in none is `other`
VK_GROUPS = {"letter": ((0x41, 0x5A),), "digit": ((0x30, 0x39), (0x60, 0x69)),
             "modifier": ((0x10, 0x12), (0x5B, 0x5C), (0xA0, 0xA5)), "navigation": ((0x21, 0x28),),
             "editing": ((0x08, 0x09), (0x0D, 0x0D), (0x1B, 0x1B), (0x20, 0x20), (0x2D, 0x2E)),
             "function": ((0x70, 0x87),)}
# the true button_flags of a mouse op (RAWMOUSE); other flags (several at once) are `other`
MOUSE_OPS = {"left_down": 0x001, "left_up": 0x002, "right_down": 0x004, "right_up": 0x008, "middle_down": 0x010,
             "middle_up": 0x020, "wheel": 0x400, "hwheel": 0x800}
# vk and action right, flags right, as numbers (`values.KEYBOARD_BOTH`, `same`: matches, which a product cannot read)
_KEY_RIGHT = within(error("vk"), 0, 0) * within(error("action"), 0, 0)
_FLAGS_RIGHT = within(error("button_flags"), 0, 0)


def _group_states(s: Shape) -> dict:
    keyboard, mouse = {"events": ONE, "right": values.KEYBOARD_BOTH}, {"events": ONE, "right": same("button_flags")}
    for name, ranges in VK_GROUPS.items():
        member = functools.reduce(Value.__add__, [within(true("vk"), low, high) for low, high in ranges])
        keyboard.update({f"{name}_events": member, f"{name}_right": member * _KEY_RIGHT})
    for name, flag in MOUSE_OPS.items():
        member = within(true("button_flags"), flag, flag)
        mouse.update({f"{name}_events": member, f"{name}_right": member * _FLAGS_RIGHT})
    return {"keyboard_groups": Sums(("comparable_keyboard",), keyboard), "mouse_ops": Sums(("comparable_mouse_op",), mouse)}


def _group_keys(r) -> dict:
    """``keyboard/{group}/accuracy`` (vk and action right) and ``/count`` over the comparable keyboard events of each
    group of the true vk; ``mouse_op/{op}/accuracy`` (button_flags right) and ``/count`` over the comparable mouse
    events with button flags; ``other``: the rest; ``keyboard/group_macro_accuracy``: the mean over the groups
    with events."""
    out = {}
    for prefix, state, names in (("keyboard", r["keyboard_groups"], VK_GROUPS), ("mouse_op", r["mouse_ops"], MOUSE_OPS)):
        events = {n: getattr(state, f"{n}_events") for n in names}
        right = {n: getattr(state, f"{n}_right") for n in names}
        events["other"], right["other"] = state.events - sum(events.values()), state.right - sum(right.values())
        for n, count in events.items():
            out[f"{prefix}/{n}/accuracy"], out[f"{prefix}/{n}/count"] = ratio(right[n], count), count
    present = [out[f"keyboard/{n}/accuracy"] for n in (*VK_GROUPS, "other") if out[f"keyboard/{n}/count"] > 0]
    if present:
        out["keyboard/group_macro_accuracy"] = torch.stack(present).mean()
    return out


KEY_GROUPS = Definition("key_groups", _group_states, _group_keys)

REPORT: list[Definition] = [EVENTS, TOKENS, TIMESTAMP, TIMESTAMP_R2, KEYBOARD, MOUSE, KEY_GROUPS, DETECTION,
                            DETECTION_SWEEP, SEQUENCES, MOVES_WITH_MISSES, D2E]


def register(definition: Definition) -> Definition:
    """Add ``definition`` to the report of every `OWAEventMetrics` built after this (its state names must be new)."""
    if any(d.name == definition.name for d in REPORT):
        raise ValueError(f"a definition named {definition.name!r} is in the report already")
    REPORT.append(definition)
    return definition


def unregister(name: str) -> None:
    """Take the definition ``name`` out of the report (metrics built before keep it)."""
    REPORT[:] = [d for d in REPORT if d.name != name]
