"""A numpy oracle of the whole report, computed from Python event pairs with the formulas of issue 3."""

import math
from fractions import Fraction

import numpy as np

from owa_metrics import Category, Event
from oracles import Band, np_bootstrap_ci, np_iqm

CATS = ["keyboard", "mouse_op", "mouse_nop", "screen"]


def digits(value, bases):
    value %= math.prod(bases)
    out = []
    for b in reversed(bases):
        out.append(value % b)
        value //= b
    return out[::-1]


class Hierarchical:
    """Issue 2's format: a 16 s window; timestamp digits over 16, 10, 10; dx / dy modulo 4000 over 2, 20, 10, 10."""

    window_ns = 16_000_000_000

    @staticmethod
    def timestamp_digits(ns):
        return digits(ns // 10**7, [16, 10, 10])

    @staticmethod
    def delta_digits(value):
        return digits(value, [2, 20, 10, 10])


class Factorized:
    """Issue 8's format: a 10 s window; 3 decimal timestamp digits; a sign (plus 0, minus 1) then |value| over 2, 10, 10, 10."""

    window_ns = 10_000_000_000

    @staticmethod
    def timestamp_digits(ns):
        return digits(ns // 10**7 % 1000, [10, 10, 10])

    @staticmethod
    def delta_digits(value):
        return [int(value < 0)] + digits(abs(value), [2, 10, 10, 10])


FORMATS = {"hierarchical": Hierarchical, "factorized": Factorized}


def precision(pairs):
    """p_j over pairs of digit lists (or lists of tuples for a joint field)."""
    if not pairs:
        return []
    k = len(pairs[0][0])
    return [np.mean([all(p[i] == t[i] for i in range(j + 1)) for p, t in pairs]) for j in range(k)]


def add_distribution(out, prefix, signed_ms, targets_ms):
    if signed_ms:
        s = np.array(signed_ms)
        out[f"{prefix}/abs_error_p95_ms"] = np.percentile(np.abs(s), 95)
        out[f"{prefix}/signed_error_iqm_ms"] = np_iqm(s)
        low, high = np_bootstrap_ci(s)
        out[f"{prefix}/signed_error_ci_low_ms"], out[f"{prefix}/signed_error_ci_high_ms"] = low, high
        pe = [abs(e) / abs(t) * 100 for e, t in zip(signed_ms, targets_ms) if t != 0]
        if pe:
            out[f"{prefix}/iqmpe_pct"] = np_iqm(pe)


def oracle_report(sequences, fmt=Hierarchical):
    """``sequences``: list of (pred_events, true_events, pred_valid_flags), events already normalized.

    Pairs the k-th predicted with the k-th true event of each sequence; ``fmt`` gives the window and digits.
    """
    return paired_report([([preds[k] if k < len(preds) and valid[k] else None for k in range(len(truths))], truths,
                           len(preds)) for preds, truths, valid in sequences], fmt)


def paired_report(sequences, fmt=Hierarchical):
    """``sequences``: list of (the predicted event paired with each true event or None, true events, number of
    predicted events)."""
    window = fmt.window_ns
    pairs, seq_rates, count_match = [], [], []
    for paired, truths, n_preds in sequences:
        count_match.append(n_preds == len(truths))
        seq = list(zip(paired, truths))
        pairs += seq
        if seq:
            seq_rates.append(np.mean([p is not None and p.kind == t.kind for p, t in seq]))
    comp = [(p, t) for p, t in pairs if p is not None and p.kind == t.kind]
    out = {"comparable_rate": len(comp) / len(pairs), "count_accuracy": np.mean(count_match),
           "comparable_rate_seq_macro": np.mean(seq_rates)}
    confusion = np.zeros((4, 5))
    for p, t in pairs:
        confusion[int(t.category), int(p.category) if p is not None else 4] += 1
    f1 = []
    for c in range(4):
        tp, fn, fp = confusion[c, c], confusion[c].sum() - confusion[c, c], confusion[:, c].sum() - confusion[c, c]
        if tp + fn + fp:
            f1.append(2 * tp / (2 * tp + fn + fp))
    out["category/macro_f1"] = np.mean(f1)
    for i, cat in enumerate(CATS):
        in_cat = [(p, t) for p, t in pairs if int(t.category) == i]
        out[f"{cat}/count"] = len(in_cat)
        out[f"{cat}/ratio"] = len(in_cat) / len(pairs)
        if in_cat:
            out[f"{cat}/comparable_rate"] = np.mean([p is not None and p.kind == t.kind for p, t in in_cat])

    def timestamp_part(prefix, group):
        signed = [((p.timestamp_ns - t.timestamp_ns + window // 2) % window - window // 2) / 1e6 for p, t in group]
        add_distribution(out, prefix, signed, [t.timestamp_ns / 1e6 for _, t in group])
        # upstream OWA's evaluator: R² of the timestamps (left out when they do not vary), |error| quantiles
        e, t_ms = np.array(signed), np.array([t.timestamp_ns / 1e6 for _, t in group])
        if len(group) and ((t_ms - t_ms.mean()) ** 2).sum() > 0:
            out[f"{prefix}/r2"] = 1 - (e ** 2).sum() / ((t_ms - t_ms.mean()) ** 2).sum()
        if prefix == "timestamp" and len(group):
            for q in (0, 25, 50, 75, 100):
                out[f"timestamp/abs_error_p{q}_ms"] = np.percentile(np.abs(e), q)
        for j, v in enumerate(precision([(fmt.timestamp_digits(p.timestamp_ns), fmt.timestamp_digits(t.timestamp_ns))
                                         for p, t in group])):
            out[f"{prefix}/precision_p{j + 1}"] = v

    timestamp_part("timestamp", comp)
    for i, cat in enumerate(CATS):
        timestamp_part(f"{cat}/timestamp", [(p, t) for p, t in comp if int(t.category) == i])

    keys = [(p, t) for p, t in comp if t.kind == "keyboard"]
    if keys:
        out["keyboard/vk_accuracy"] = np.mean([p.vk == t.vk for p, t in keys])
        out["keyboard/action_accuracy"] = np.mean([p.action == t.action for p, t in keys])
        out["keyboard/accuracy"] = np.mean([p.vk == t.vk and p.action == t.action for p, t in keys])

    mouse = [(p, t) for p, t in comp if t.kind == "mouse"]
    if mouse:
        acts = [(p, t) for p, t in mouse if t.button_flags]
        if acts:
            out["mouse/action_accuracy"] = np.mean([p.button_flags == t.button_flags for p, t in acts])
        scrolls = [(p, t) for p, t in mouse if t.button_data]
        if scrolls:
            out["mouse/scroll_accuracy"] = np.mean([p.button_data == t.button_data for p, t in scrolls])
        eu = [100 * math.sqrt(Fraction((p.dx - t.dx) ** 2 + (p.dy - t.dy) ** 2, t.dx ** 2 + t.dy ** 2))
              for p, t in mouse if (t.dx, t.dy) != (0, 0)]  # equal ratios: equal values (ties decide the IQM)
        if eu:
            out["mouse/euclidean_pe_p95_pct"] = np.percentile(eu, 95)
            out["mouse/euclidean_iqmpe_pct"] = np_iqm(eu)
        for axis, get in (("x", lambda e: e.dx), ("y", lambda e: e.dy)):
            signed = [(get(p) - get(t)) / get(t) * 100 for p, t in mouse if get(t) != 0]
            if signed:
                out[f"mouse/signed_pe_{axis}_iqm_pct"] = np_iqm(signed)
                low, high = np_bootstrap_ci(signed)
                out[f"mouse/signed_pe_{axis}_ci_low_pct"], out[f"mouse/signed_pe_{axis}_ci_high_pct"] = low, high
                out[f"mouse/d{axis}_iqmpe_pct"] = np_iqm(np.abs(signed))
        angles = []
        for p, t in mouse:
            if (t.dx, t.dy) != (0, 0):
                d = abs(math.atan2(p.dy, p.dx) - math.atan2(t.dy, t.dx))
                angles.append(math.degrees(min(d, 2 * math.pi - d)))
        if angles:
            out["mouse/direction_error_p50_deg"], out["mouse/direction_error_p95_deg"] = np.percentile(angles, [50, 95])
        dx = [(fmt.delta_digits(p.dx), fmt.delta_digits(t.dx)) for p, t in mouse]
        dy = [(fmt.delta_digits(p.dy), fmt.delta_digits(t.dy)) for p, t in mouse]
        joint = [(list(zip(a[0], b[0])), list(zip(a[1], b[1]))) for a, b in zip(dx, dy)]
        for name, group in (("dx", dx), ("dy", dy), ("euclidean", joint)):
            for j, v in enumerate(precision(group)):
                out[f"mouse/{name}_precision_p{j + 1}"] = v
        g = np.array([[t.dx, t.dy] for _, t in mouse], dtype=float)
        pr = np.array([[p.dx, p.dy] for p, _ in mouse], dtype=float)
        total = ((g - g.mean(0)) ** 2).sum()
        if total:
            out["mouse/r2"] = 1 - ((pr - g) ** 2).sum() / total
    return {k: v if isinstance(v, Band) else float(v) for k, v in out.items()  # a CI end: its Band
            if not (isinstance(v, (float, Band)) and math.isnan(float(v)))}


def perturb(events, rng, *, change_kinds=True):
    """Seeded prediction errors: time shifts (some past the window's wrap), mouse delta noise, wrong keys and
    actions, wrong buttons and scrolls; with ``change_kinds`` also dropped, extra and wrong-kind events.
    Without it every predicted event keeps its token layout (for teacher forcing)."""
    out = []
    for e in events:
        if change_kinds and rng.random() < 0.03:
            continue
        shift_ns = int(rng.choice([0, 0, 10, -20, 120, -350, 15_990])) * 10**6
        ts = e.timestamp_ns + shift_ns
        if change_kinds and rng.random() < 0.04:
            out.append(Event(kind="keyboard", timestamp_ns=ts, vk=int(rng.integers(0, 256)), action="press")
                       if e.kind != "keyboard" else Event(kind="screen", timestamp_ns=ts))
        elif e.kind == "keyboard":
            vk = e.vk if rng.random() < 0.85 else int(rng.integers(0, 256))
            action = e.action if rng.random() < 0.9 else ("press" if e.action == "release" else "release")
            out.append(Event(kind="keyboard", timestamp_ns=ts, vk=vk, action=action))
        elif e.kind == "mouse":
            noise = rng.integers(-3, 4, size=2) * (rng.random() < 0.6)
            flags = e.button_flags if rng.random() < 0.8 else int(rng.choice([0, 1, 2, 4]))
            data = e.button_data
            if data and rng.random() < 0.3:
                data = -data
            out.append(Event(kind="mouse", timestamp_ns=ts, dx=e.dx + int(noise[0]), dy=e.dy + int(noise[1]),
                             button_flags=flags, button_data=data))
        else:
            out.append(Event(kind="screen", timestamp_ns=ts))
        if change_kinds and rng.random() < 0.02:
            out.append(Event(kind="mouse", timestamp_ns=ts, dx=1, dy=1))
    return out


def category_of(e):
    return Category(e.category)
