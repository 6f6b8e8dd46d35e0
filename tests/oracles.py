"""Independent oracles written from the issue's format description (not from the package's code)."""

from owa_metrics import Event

UNIT_NS = 10_000_000
WINDOW_UNITS = 16 * 10 * 10


def normalized(e: Event) -> Event:
    """What decode(encode(e)) must give: 10 ms units modulo the 16 s window, clamped deltas, scroll steps."""
    ts = (e.timestamp_ns // UNIT_NS) % WINDOW_UNITS * UNIT_NS
    if e.kind == "keyboard":
        return Event(kind="keyboard", timestamp_ns=ts, vk=e.vk, action=e.action)
    if e.kind == "screen":
        return Event(kind="screen", timestamp_ns=ts)
    bd = 0
    if e.button_data:
        s16 = (e.button_data + 32768) % 65536 - 32768
        bd = min(max(s16 // 120, -10), 9) * 120
    return Event(kind="mouse", timestamp_ns=ts, dx=min(max(e.dx, -2000), 1999), dy=min(max(e.dy, -2000), 1999),
                 button_flags=e.button_flags, button_data=bd)


def batch_rows(batch) -> list[dict]:
    """An EventBatch as the reference path's list of row dicts (for field-by-field comparison)."""
    names = ["status", "kind", "category", "timestamp_ns", "vk", "action", "dx", "dy", "button_flags",
             "button_data", "timestamp_digits", "dx_digits", "dy_digits", "start", "end", "start_cut"]
    sides = {side: {n: getattr(getattr(batch, side), n).tolist() for n in names} for side in ("target", "pred")}
    seq, status = batch.seq_idx.tolist(), batch.status.tolist()
    return [{"seq": seq[i], "status": status[i],
             **{side: {n: sides[side][n][i] for n in names} for side in sides}} for i in range(len(seq))]


# ------------------------------------------------------------------ numpy statistics (issue 3's definitions)
import math  # noqa: E402

import numpy as np  # noqa: E402


def np_iqm(x):
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.nan
    q25, q75 = np.percentile(x, [25, 75])
    inside = x[(x >= q25) & (x <= q75)]
    return inside.mean() if inside.size else np.nan


def np_bootstrap_ci(x, resamples=1000, seed=42, tail_margin=4.0):
    """Issue 9's bootstrap, from its definition (README "Statistics"): the distinct values split into a left
    tail (every rank below r25 - w), kept values and a right tail (every rank above r75 + w); with
    rng = default_rng(seed): the group totals of all resamples ~ Multinomial(n, group sizes / n), then per
    resample the kept counts (multinomial over the kept values, or sample by sample when there are more than
    max(256, kept samples / 8) of them), a resample whose tail count reaches a quartile rank getting its tails split by
    default_rng([seed, 1]). Each resample's IQM is np_iqm of its values written out; CI = 2.5 / 97.5
    percentiles."""
    values, freq = np.unique(np.asarray(x, dtype=np.float64), return_counts=True)
    n = int(freq.sum())
    if n == 0:
        return np.array([np.nan, np.nan])
    w = math.ceil(tail_margin * math.sqrt(n))
    r25, r75 = math.floor(0.25 * (n - 1)), math.ceil(0.75 * (n - 1))
    last_rank = np.cumsum(freq) - 1
    first_rank = last_rank - freq + 1
    left, right = last_rank < r25 - w, first_rank > r75 + w
    mid = ~left & ~right
    sizes = np.array([freq[left].sum(), freq[mid].sum(), freq[right].sum()])
    rng, split = np.random.default_rng(seed), np.random.default_rng([seed, 1])
    totals = np.zeros((resamples, 3), dtype=np.int64)
    totals[:, sizes > 0] = rng.multinomial(n, sizes[sizes > 0] / n, size=resamples)
    kept_values, kept_freq = values[mid], freq[mid]
    iqms = []
    for t_left, t_kept, t_right in totals:
        if kept_freq.size <= max(256, sizes[1] / 8):
            kept = np.repeat(kept_values, rng.multinomial(t_kept, kept_freq / sizes[1]))
        else:  # t_kept samples drawn one by one among the kept samples (in value order)
            kept = np.repeat(kept_values, kept_freq)[rng.integers(0, sizes[1], size=t_kept)]
        if t_left > r25 or t_right >= n - r75:
            tails = [np.repeat(values[side], split.multinomial(t, freq[side] / freq[side].sum())) if side.any()
                     else np.zeros(0) for t, side in ((t_left, left), (t_right, right))]
        else:  # the tails written out as their extreme values: a wrong IQM if a quartile read one
            tails = [np.full(t_left, values[0]), np.full(t_right, values[-1])]
        iqms.append(np_iqm(np.concatenate([tails[0], kept, tails[1]])))
    return np.percentile(iqms, [2.5, 97.5])


def np_bootstrap_ci_by_index(x, resamples, seed):
    """The textbook bootstrap: n indices drawn with replacement per resample (default_rng(seed).integers)."""
    xs = np.asarray(x, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, xs.size, size=(resamples, xs.size))
    return np.percentile([np_iqm(xs[row]) for row in idx], [2.5, 97.5])


def close(got, want, rel=1e-6):
    got, want = float(got), float(want)
    if np.isnan(want):
        return np.isnan(got)
    return abs(got - want) <= rel * max(1.0, abs(want))


def expected_prompt(ids, vocab, predict_events, budget):
    """Row ``ids``' prompt by the definitions (issue 44 item 2), over the token list: cut before its last
    ``predict_events`` actions (an event whose type is not <SCREEN>; the first one kept), then, when longer than
    ``budget``, from the first event start from which it fits. Returns (prompt, where it was cut)."""
    start, screen = vocab.ids["<EVENT_START>"], vocab.ids["<SCREEN>"]
    events = [i for i, t in enumerate(ids) if t == start]
    actions = [i for i in events if ids[i + 1] != screen]
    keep = max(len(actions) - predict_events, min(len(actions), 1))
    cut = actions[keep] if keep < len(actions) else len(ids)
    first = 0 if cut <= budget else next(i for i in events if cut - i <= budget)
    return ids[first:cut], cut
