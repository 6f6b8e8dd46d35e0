"""A plain-Python oracle of what a generated sequence does (issue 26), written from the issue's definitions.

Per row, each side's valid events in order (the string reference path); the cursor path is the running sum of the
mouse events' (dx, dy); Levenshtein by the textbook recurrence; under time pairing the absolute times and pairs of
`matching_oracle` (the issue-11 oracle).
"""

import math

from matching_oracle import parse_rows, row_pairs, to_event
from metric_oracle import Hierarchical

BUTTON_DOWN = (0x001, 0x004, 0x010)


def levenshtein(a, b):
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def quantile(xs, q):
    """numpy's default (linear) quantile."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def path(events):
    """P after each event: the running sum of the mouse events' (dx, dy), with P = (0, 0) before the first."""
    out = [(0, 0)]
    for e in events:
        x, y = out[-1]
        out.append((x + e.dx, y + e.dy) if e.kind == "mouse" else (x, y))
    return out


def sequence_oracle(pred_rows, target_rows, vocab, origins=None, fmt=Hierarchical, tolerance_ms=100):
    """``{"index": keys, "time": keys}`` for rows of generated and target token ids (lists, -100 ignored)."""
    tolerance = round(tolerance_ms * 1_000_000)
    clicks, ends = {"index": [], "time": []}, {"index": [], "time": []}
    distance = length = exact = keyboard_rows = 0
    moves = []  # (predicted, true, paired) of the true moves, time pairing
    for b, (gen, true) in enumerate(zip(parse_rows(pred_rows, vocab), parse_rows(target_rows, vocab))):
        truths = [to_event(d) for d in true if d["status"] == 0]
        preds = [to_event(d) for d in gen if d["status"] == 0]
        true_keys = [(e.vk, e.action) for e in truths if e.kind == "keyboard"]
        gen_keys = [(e.vk, e.action) for e in preds if e.kind == "keyboard"]
        distance += levenshtein(gen_keys, true_keys)
        length += len(true_keys)
        if true_keys:
            keyboard_rows += 1
            exact += gen_keys == true_keys
        a_t, a_p, _, pairs = row_pairs(truths, preds, None if origins is None else origins[b], fmt.window_ns,
                                       tolerance)
        p_true, p_gen = path(truths), path(preds)
        for pairing in ("index", "time"):
            offsets = []
            for k, e in enumerate(truths):
                if pairing == "index":  # after as many generated events as true events so far
                    gx, gy = p_gen[min(k + 1, len(preds))]
                else:  # the generated events at absolute times <= the true event's
                    gx = sum(p.dx for p, a in zip(preds, a_p) if p.kind == "mouse" and a <= a_t[k])
                    gy = sum(p.dy for p, a in zip(preds, a_p) if p.kind == "mouse" and a <= a_t[k])
                tx, ty = p_true[k + 1]
                offsets.append(math.hypot(gx - tx, gy - ty))
                if e.kind == "mouse" and any(e.button_flags & f for f in BUTTON_DOWN):
                    clicks[pairing].append(offsets[-1])
            if any(e.kind == "mouse" for e in truths):
                ends[pairing].append(offsets[-1])
        for i, e in enumerate(truths):
            if e.kind == "mouse" and (e.dx, e.dy) != (0, 0):
                p = preds[pairs[i]] if i in pairs else None
                moves.append(((p.dx, p.dy) if p is not None else (0, 0), (e.dx, e.dy), p is not None))
    out = {}
    for pairing in ("index", "time"):
        keys = {"count/click_events": len(clicks[pairing]), "count/path_rows": len(ends[pairing]),
                "count/keyboard_sequence_rows": keyboard_rows}
        if clicks[pairing]:
            keys["mouse/click_offset_p50_mu"] = quantile(clicks[pairing], 0.5)
            keys["mouse/click_offset_p95_mu"] = quantile(clicks[pairing], 0.95)
        if ends[pairing]:
            keys["mouse/path_end_offset_p50_mu"] = quantile(ends[pairing], 0.5)
        if length:
            keys["keyboard/sequence_error_rate"] = distance / length
        if keyboard_rows:
            keys["keyboard/sequence_exact_rate"] = exact / keyboard_rows
        out[pairing] = keys
    out["time"].update(moves_with_misses(moves))
    return out


def moves_with_misses(moves):
    """R² with the misses as (0, 0), the mean cosine (0 for a zero prediction), coverage = paired / all."""
    out = {"count/move_events": len(moves)}
    if not moves:
        return out
    n = len(moves)
    mx, my = sum(t[0] for _, t, _ in moves) / n, sum(t[1] for _, t, _ in moves) / n
    residual = sum((p[0] - t[0]) ** 2 + (p[1] - t[1]) ** 2 for p, t, _ in moves)
    total = sum((t[0] - mx) ** 2 + (t[1] - my) ** 2 for _, t, _ in moves)
    if total > 0:
        out["mouse/r2_with_misses"] = 1 - residual / total
    cosines = [(p[0] * t[0] + p[1] * t[1]) / (math.hypot(*p) * math.hypot(*t)) if p != (0, 0) else 0.0
               for p, t, _ in moves]
    out["mouse/cosine_with_misses"] = sum(cosines) / n
    out["mouse/move_coverage"] = sum(paired for _, _, paired in moves) / n
    return out
