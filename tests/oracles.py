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
import numpy as np  # noqa: E402


def np_iqm(x):
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.nan
    q25, q75 = np.percentile(x, [25, 75])
    inside = x[(x >= q25) & (x <= q75)]
    return inside.mean() if inside.size else np.nan


def np_bootstrap_ci(x, resamples=1000, seed=42):
    """B resamples of the sorted sample, indices from numpy's default_rng(seed); 2.5 / 97.5 percentiles."""
    xs = np.sort(np.asarray(x, dtype=np.float64))
    if xs.size == 0:
        return np.array([np.nan, np.nan])
    idx = np.random.default_rng(seed).integers(0, xs.size, size=(resamples, xs.size))
    return np.percentile([np_iqm(xs[row]) for row in idx], [2.5, 97.5])


def close(got, want, rel=1e-6):
    got, want = float(got), float(want)
    if np.isnan(want):
        return np.isnan(got)
    return abs(got - want) <= rel * max(1.0, abs(want))
