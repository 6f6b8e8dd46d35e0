"""A plain-Python oracle of generation by time (issue 11), written from the issue's definitions.

Events are read per row with the string reference path (`reference_decode`), unwrapped one by one, matched by
the sequential greedy rule (detection, then kind), counted, and the pairs scored by `metric_oracle.paired_report`.
"""

from owa_metrics import Event, reference_decode

from metric_oracle import CATS, Hierarchical, paired_report
from oracles import Band

SECOND_NS = 1_000_000_000


def parse_rows(rows, vocab):
    """Per row: the events of one side (a list of token ids, -100 ignored) as reference dicts, in order."""
    out = [[] for _ in rows]
    for r in reference_decode(rows, rows, vocab, "teacher_forcing"):
        out[r["seq"]].append(r["target"])
    return out


def to_event(d):
    cat = CATS[d["category"]]
    if cat == "keyboard":
        return Event(kind="keyboard", timestamp_ns=d["timestamp_ns"], vk=d["vk"],
                     action="release" if d["action"] else "press")
    if cat == "screen":
        return Event(kind="screen", timestamp_ns=d["timestamp_ns"])
    return Event(kind="mouse", timestamp_ns=d["timestamp_ns"], dx=d["dx"], dy=d["dy"],
                 button_flags=d["button_flags"], button_data=d["button_data"])


def signed(x, window):
    return (x + window // 2) % window - window // 2


def unwrap(timestamps, origin, window):
    """a_0 = o + signed(t_0 - o); a_k = a_{k-1} + d, d = (t_k - t_{k-1}) mod W, minus W when d > W - 1 s."""
    out = []
    for k, t in enumerate(timestamps):
        if k == 0:
            out.append(origin + signed(t - origin, window))
        else:
            d = (t - timestamps[k - 1]) % window
            out.append(out[-1] + (d - window if d > window - SECOND_NS else d))
    return out


def greedy(targets, candidates, tolerance):
    """targets / candidates: lists of (a, key) in position order -> {target index: candidate index}."""
    used, match = set(), {}
    for i in sorted(range(len(targets)), key=lambda i: (targets[i][0], i)):
        a, key = targets[i]
        best = None
        for j, (a_p, key_p) in enumerate(candidates):
            if j not in used and key_p == key and abs(a_p - a) <= tolerance and (best is None or abs(a_p - a) < best[0]):
                best = (abs(a_p - a), j)  # strictly smaller: ties keep the earlier candidate
        if best is not None:
            match[i] = best[1]
            used.add(best[1])
    return match


def detection_key(e):
    cat = int(e.category)
    if e.kind == "keyboard":
        return cat, e.vk, e.action
    return (cat, e.button_flags) if CATS[cat] == "mouse_op" else (cat,)


def prf(tp, fp, fn):
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def row_pairs(truths, preds, origin, window, tolerance):
    """One row's valid events -> (absolute times of each side, the detection matches, the pairs: {true: pred})."""
    origin = origin if origin is not None and origin >= 0 else (truths[0].timestamp_ns if truths else 0)
    a_t = unwrap([e.timestamp_ns for e in truths], origin, window)
    a_p = unwrap([e.timestamp_ns for e in preds], origin, window)
    found = greedy([(a, detection_key(e)) for a, e in zip(a_t, truths)],
                   [(a, detection_key(e)) for a, e in zip(a_p, preds)], tolerance)
    taken = set(found.values())
    rest_t = [i for i in range(len(truths)) if i not in found]
    rest_p = [j for j in range(len(preds)) if j not in taken]
    by_kind = greedy([(a_t[i], truths[i].kind) for i in rest_t], [(a_p[j], preds[j].kind) for j in rest_p], tolerance)
    pairs = dict(found)
    pairs.update({rest_t[i]: rest_p[j] for i, j in by_kind.items()})
    return a_t, a_p, found, pairs


def time_oracle(pred_rows, target_rows, vocab, tolerance_ms=100, origins=None, fmt=Hierarchical):
    """The report of ``pairing="time"``: rows of generated and target token ids (lists, -100 ignored); ``origins``
    one per row (None or negative: the row's first valid target event)."""
    window, tolerance = fmt.window_ns, round(tolerance_ms * 1_000_000)
    tp, fp, fn = [0] * 4, [0] * 4, [0] * 4
    invalid = extra = missing = n_pred = n_target = 0
    errors, sequences = [], []
    for b, (gen, true) in enumerate(zip(parse_rows(pred_rows, vocab), parse_rows(target_rows, vocab))):
        n_pred, n_target = n_pred + len(gen), n_target + len(true)
        assert all(d["status"] == 0 for d in true), "the oracle takes valid targets only"
        truths = [to_event(d) for d in true]
        preds = [to_event(d) for d in gen if d["status"] == 0]
        invalid += len(gen) - len(preds)
        a_t, a_p, found, pairs = row_pairs(truths, preds, origins[b] if origins is not None else None, window,
                                           tolerance)
        for i, e in enumerate(truths):
            c = int(e.category)
            if i in found:
                tp[c] += 1
                errors.append(abs(a_p[found[i]] - a_t[i]) / 1e6)
            else:
                fn[c] += 1
        taken = set(found.values())
        for j, e in enumerate(preds):
            if j not in taken:
                fp[int(e.category)] += 1
        extra += len(preds) - len(pairs)
        missing += len(truths) - len(pairs)
        sequences.append(([preds[pairs[i]] if i in pairs else None for i in range(len(truths))], truths, len(gen)))
    out = paired_report(sequences, fmt) if n_target else {}
    for c, cat in enumerate(CATS):
        if tp[c] + fp[c] + fn[c]:
            out.update(zip((f"detect/{cat}/precision", f"detect/{cat}/recall", f"detect/{cat}/f1"),
                           prf(tp[c], fp[c], fn[c])))
    micro = [sum(x[:3]) for x in (tp, fp, fn)]
    micro[1] += invalid
    if sum(micro):
        out.update(zip(("detect/precision", "detect/recall", "detect/f1"), prf(*micro)))
    if errors:
        errors.sort()
        m = len(errors)
        out["detect/time_error_abs_p50_ms"] = (errors[(m - 1) // 2] + errors[m // 2]) / 2
    out.update({"count/extra_events": extra, "count/invalid_pred_events": invalid, "count/missing_events": missing,
                "count/pred_events": n_pred, "count/target_events": n_target, "status/missing": missing,
                "count/comparable": n_target - missing, "status/valid": n_target - missing})
    return {k: v if isinstance(v, Band) else float(v) for k, v in out.items()}  # a CI end: its Band
