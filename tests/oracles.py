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


ORACLE_RESAMPLES = 2000  # the oracle's own bootstrap resamples
BAND_SIGMAS = 4.5  # Monte-Carlo standard errors a CI end may lie off the oracle's (per end; the tests are seeded)


def np_bootstrap_iqms(x, resamples, seed):
    """The textbook bootstrap: per resample n values drawn with replacement (default_rng(seed).integers), its IQM
    (np_iqm's definition: the quartiles by numpy's linear interpolation between order statistics of the sorted
    resample; NaN where [Q25, Q75] holds none)."""
    xs = np.asarray(x, dtype=np.float64)
    n, rng, out = xs.size, np.random.default_rng(seed), []
    for rows in np.array_split(np.arange(resamples), max(1, resamples * n // 2**22)):  # ~32 MB at a time
        sample = np.sort(xs[rng.integers(0, n, size=(rows.size, n))], axis=1)
        quartiles = []
        for h in (0.25 * (n - 1), 0.75 * (n - 1)):
            low, high = sample[:, math.floor(h)], sample[:, min(math.floor(h) + 1, n - 1)]
            quartiles.append(low + (high - low) * (h - math.floor(h)))
        inside = (sample >= quartiles[0][:, None]) & (sample <= quartiles[1][:, None])
        with np.errstate(invalid="ignore"):
            out.append(np.where(inside, sample, 0.0).sum(1) / inside.sum(1))
    return np.concatenate(out)


class Band:
    """Where a bootstrap CI end must lie: [lo, hi] (`close` reads it); float() gives the oracle's own end."""

    def __init__(self, lo, hi, mid):
        self.lo, self.hi, self.mid = float(lo), float(hi), float(mid)

    def __float__(self):
        return self.mid

    def __repr__(self):
        return f"Band({self.lo!r}, {self.hi!r})"


def np_bootstrap_ci(x, resamples=1000, seed=42, confidence=0.95, oracle_resamples=ORACLE_RESAMPLES):
    """The percentile bootstrap CI of the IQM of ``x`` made of ``resamples`` resamples, each end as the Band the
    oracle's ``oracle_resamples`` IQMs (`np_bootstrap_iqms`) give it: the end at p = (1 -/+ confidence) / 2 is the
    p-quantile of the replicates' distribution F, estimated twice (by the code, from ``resamples``; here, from
    ``oracle_resamples``), so it lies between the oracle's quantiles at p -/+ BAND_SIGMAS sqrt(p (1 - p)
    (1 / resamples + 1 / oracle_resamples)) unless the code's resamples are not F's (the order statistics'
    binomial error; valid with ties: F may step). NaN ends when a resample's IQM can be NaN (n = 2, two values)."""
    xs = np.asarray(x, dtype=np.float64)
    if xs.size == 0:
        return [Band(np.nan, np.nan, np.nan)] * 2
    iqms = np_bootstrap_iqms(xs, oracle_resamples, seed + 10**6)  # a stream of its own, not the code's seed
    return band_of(iqms, resamples, confidence, oracle_resamples)


def band_of(iqms, resamples=1000, confidence=0.95, oracle_resamples=ORACLE_RESAMPLES):
    """`np_bootstrap_ci`'s Bands from the oracle's resample IQMs ``iqms``."""
    if np.isnan(iqms).any():
        return [Band(np.nan, np.nan, np.nan)] * 2
    out = []
    for p in ((1 - confidence) / 2, (1 + confidence) / 2):
        delta = BAND_SIGMAS * math.sqrt(p * (1 - p) * (1 / resamples + 1 / oracle_resamples))
        lo, mid, hi = np.quantile(iqms, [max(p - delta, 0.0), p, min(p + delta, 1.0)])
        out.append(Band(lo, hi, mid))
    return out


def close(got, want, rel=1e-6):
    """|got - want| <= rel max(1, |want|); a Band: got within it, each side widened as much."""
    if isinstance(want, Band):
        if np.isnan(want.lo) or np.isnan(float(got)):
            return np.isnan(want.lo) and np.isnan(float(got))
        return close(got, min(max(float(got), want.lo), want.hi), rel)
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
