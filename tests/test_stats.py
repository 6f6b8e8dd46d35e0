import math

import numpy as np
import pytest
import torch

from owa_metrics.functional.events import digit_precision_accuracy, direction_error_deg, wrapped_difference
from owa_metrics.functional.stats import (
    SketchSpec, bootstrap_iqm_ci, bootstrap_iqm_ci_of_counts, distinct, iqm, iqm_of_counts, quantile,
    quantile_of_counts, sketch_bootstrap_iqm_ci, sketch_counts, sketch_iqm, sketch_quantile,
)
from oracles import band_of, close, np_bootstrap_ci, np_iqm

QS = [0, 0.01, 0.025, 0.25, 0.5, 0.75, 0.95, 0.99, 1]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Values, not speed, are tested here: one intra-op thread, so that a busy shared machine does not make
    torch's thread pool wait on itself (10x slower on 2 loaded cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(kind: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "integer":  # mouse deltas
        return rng.integers(-40, 41, n).astype(np.float64)
    if kind == "float":  # all distinct
        return rng.standard_t(3, n) * 50
    return np.round(rng.standard_t(2, n) * 3) * 10  # ties: multiples of 10 ms, a third of them 0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 100, 1000])
def test_exact_statistics_equal_numpy(n):
    x = np.random.default_rng(n).standard_t(3, size=n) * 50
    qs = [0, 0.025, 0.25, 0.5, 0.75, 0.95, 1]
    got = quantile(torch.from_numpy(x), qs).numpy()
    assert np.allclose(got, np.percentile(x, [100 * q for q in qs]), rtol=1e-12)
    assert close(iqm(torch.from_numpy(x)), np_iqm(x), 1e-12)
    ci = bootstrap_iqm_ci(torch.from_numpy(x)).numpy()
    want = np_bootstrap_ci(x)
    assert close(ci[0], want[0], 1e-9) and close(ci[1], want[1], 1e-9)


@pytest.mark.parametrize("tail_margin", [4.0, 0.0])  # 0: tails at the quartile ranks, so about half the resamples split
@pytest.mark.parametrize("kind, n", [("integer", 3000), ("float", 2000), ("ties", 5000)])
def test_bootstrap_over_distinct_values_agrees_with_the_textbook_bootstrap(kind, n, tail_margin):
    """Each CI end within the Monte-Carlo band of the textbook bootstrap's (`np_bootstrap_ci`): by value (integers,
    ties) and sample by sample (floats), tails merged or split at every quartile."""
    x = _data(kind, n)
    assert np.allclose(quantile(torch.from_numpy(x), QS).numpy(), np.percentile(x, [100 * q for q in QS]), rtol=1e-12)
    assert close(iqm(torch.from_numpy(x)), np_iqm(x), 1e-12)
    got = bootstrap_iqm_ci(torch.from_numpy(x), tail_margin=tail_margin).numpy()
    want = np_bootstrap_ci(x)
    assert close(got[0], want[0], 1e-9) and close(got[1], want[1], 1e-9), (got, want)
    assert got[0] < np_iqm(x) < got[1]


def test_statistics_past_2_24_values_equal_the_oracle():
    n = (1 << 24) + 3
    x = np.random.default_rng(1).integers(-300, 301, n).astype(np.float64)
    values, counts = distinct(torch.from_numpy(x))  # the one sort the metrics make per distribution
    assert np.array_equal(quantile_of_counts(values, counts, [0.25, 0.5, 0.95]).numpy(), np.percentile(x, [25, 50, 95]))
    assert close(iqm_of_counts(values, counts), np_iqm(x), 1e-12)
    got = bootstrap_iqm_ci_of_counts(values, counts, num_resamples=4).numpy()
    # the textbook bootstrap's IQMs from its counts (n values drawn with replacement: counts ~ Multinomial(n, c / n))
    v, c = np.unique(x, return_counts=True)
    want = band_of(np.array([_np_iqm_of_counts(v, row) for row in np.random.default_rng(5).multinomial(
        n, c / n, size=400)]), resamples=4, oracle_resamples=400)
    assert close(got[0], want[0], 1e-9) and close(got[1], want[1], 1e-9), (got, want)


def _np_iqm_of_counts(values: np.ndarray, counts: np.ndarray) -> float:
    """np_iqm of ``values`` repeated ``counts`` times, without writing them out: the order statistic of rank r is
    the value whose cumulative count first exceeds r, the quartiles interpolated between two (numpy's linear)."""
    cum, n = np.cumsum(counts), int(counts.sum())
    at = lambda r: values[np.searchsorted(cum, r, side="right")]  # noqa: E731
    q25, q75 = (at(math.floor(h)) + (at(min(math.floor(h) + 1, n - 1)) - at(math.floor(h))) * (h - math.floor(h))
                for h in (0.25 * (n - 1), 0.75 * (n - 1)))
    inside = (values >= q25) & (values <= q75)
    return float((values * counts)[inside].sum() / counts[inside].sum())


def test_the_iqm_of_counts_oracle_is_np_iqm():
    rng = np.random.default_rng(2)
    for n in (1, 3, 4, 10, 997):
        values = np.sort(rng.choice(np.round(rng.standard_t(2, 400) * 7, 1), 60, replace=False))
        counts = rng.multinomial(n, rng.dirichlet(np.full(values.size, 0.3)))
        assert close(_np_iqm_of_counts(values, counts), np_iqm(np.repeat(values, counts)), 1e-12), n


def _index_bootstrap_ci(x: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The textbook bootstrap, written independently: n indices with replacement per resample."""
    rows = np.sort(x[np.random.default_rng(seed).integers(0, x.size, (resamples, x.size))], axis=1)
    q25, q75 = np.percentile(rows, [25, 75], axis=1)
    inside = (rows >= q25[:, None]) & (rows <= q75[:, None])
    return np.percentile((rows * inside).sum(1) / inside.sum(1), [2.5, 97.5])


def _ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.union1d(a, b)
    cdf = lambda s: np.searchsorted(np.sort(s), grid, side="right") / s.size  # noqa: E731
    return float(np.abs(cdf(a) - cdf(b)).max())


@pytest.mark.parametrize("kind", ["ties", "float"])  # kept counts by value / sample by sample
def test_resampling_counts_has_the_distribution_of_resampling_indices(kind):
    """Over many seeds, the CI ends of the count bootstrap (tails merged, or split at every quartile) and of
    the index bootstrap are one distribution (two-sample Kolmogorov-Smirnov, alpha = 0.001); resamples of
    n / 2 values (a wrong procedure: CIs sqrt(2) wider) are rejected, so the test can fail."""
    x = _data(kind, 400, seed=7)
    seeds, resamples = range(200), 50
    critical = math.sqrt(-math.log(0.001 / 2) / 2) * math.sqrt(2 / len(seeds))
    by_index = np.array([_index_bootstrap_ci(x, resamples, 1000 + s) for s in seeds])
    for margin in (4.0, 0.0):
        by_counts = np.array([bootstrap_iqm_ci(torch.from_numpy(x), resamples, s, tail_margin=margin).numpy()
                              for s in seeds])
        for end in (0, 1):
            assert _ks_distance(by_counts[:, end], by_index[:, end]) < critical, (margin, end)
    wrong = np.array([bootstrap_iqm_ci(torch.from_numpy(x[::2]), resamples, s).numpy() for s in seeds])
    assert _ks_distance(wrong[:, 0], by_index[:, 0]) > critical


def test_iqm_is_the_mean_inside_the_quartiles_not_of_the_quartiles():
    x = torch.tensor([0.0, 1, 2, 3, 100])  # Q25 = 1, Q75 = 3 -> mean(1, 2, 3) = 2
    assert iqm(x).item() == 2.0
    assert torch.isnan(iqm(torch.tensor([]))) and torch.isnan(bootstrap_iqm_ci(torch.tensor([]))).all()


def test_bootstrap_depends_on_the_values_not_their_order():
    """Issue 47 too: the CI is a function of the values and the seed (bit for bit), sample by sample and by value."""
    x = torch.randn(500, dtype=torch.float64)
    assert torch.equal(bootstrap_iqm_ci(x), bootstrap_iqm_ci(x.flip(0)))
    assert not torch.equal(bootstrap_iqm_ci(x), bootstrap_iqm_ci(x, seed=7))
    for x in (torch.from_numpy(_data("float", 3000, seed=1)), torch.from_numpy(_data("ties", 3000, seed=1))):
        ci = bootstrap_iqm_ci(x)
        assert torch.equal(ci, bootstrap_iqm_ci(x)) and torch.equal(ci, bootstrap_iqm_ci(x[torch.randperm(x.numel())]))
        assert not torch.equal(ci, bootstrap_iqm_ci(x, seed=7))


def test_the_ci_covers_the_true_iqm_about_95_percent_of_the_time():
    """Issue 47: over 400 samples of 300 values the 95 % CI (500 resamples, a seed per sample) holds the population's
    IQM in 95 % of them, within 4.5 binomial standard errors (+-4.9 %): exponential values (all distinct: drawn
    sample by sample), whose IQM E[X | Q25 <= X <= Q75] = 2 ((q1 + 1) e^-q1 - (q3 + 1) e^-q3), q1 = ln(4/3),
    q3 = ln 4; and 5 levels (ties: by value) of probabilities .15 .2 .3 .2 .15, each quartile inside a level's
    (F jumps over 1/4 and 3/4 by 0.2), whose IQM is the mean of the middle three: (0.2 0.5 + 0.3 2 + 0.2 7) / 0.7."""
    q1, q3 = math.log(4 / 3), math.log(4)
    levels, shares = np.array([-3.0, 0.5, 2.0, 7.0, 40.0]), np.array([0.15, 0.2, 0.3, 0.2, 0.15])
    rng, trials = np.random.default_rng(0), 400
    cases = ((lambda: rng.exponential(size=300), 2 * ((q1 + 1) * math.exp(-q1) - (q3 + 1) * math.exp(-q3))),
             (lambda: rng.choice(levels, size=300, p=shares), 3.0))
    for draw, want in cases:
        covered = 0
        for seed in range(trials):
            low, high = bootstrap_iqm_ci(torch.from_numpy(draw()), num_resamples=500, seed=seed).tolist()
            covered += low <= want <= high
        assert abs(covered / trials - 0.95) <= 4.5 * math.sqrt(0.95 * 0.05 / trials), (want, covered / trials)


def test_quantile_past_torch_quantile_limit():
    n = (1 << 24) + 3  # torch.quantile refuses inputs this large
    x = torch.from_numpy(np.random.default_rng(0).random(n))
    with pytest.raises(RuntimeError, match="too large"):  # refused by size, after a sort: sort the cheapest input
        torch.quantile(torch.zeros_like(x), 0.5)
    assert np.allclose(quantile(x, [0.25, 0.95]).numpy(), np.percentile(x.numpy(), [25, 95]), rtol=1e-12)


def test_worked_examples():
    # seed 004: <0><2><5> vs <3><2><5> -> 0, 0, 0;  <2><2><5> vs <2><2><7> -> 1, 1, 0
    assert digit_precision_accuracy(torch.tensor([[0, 2, 5]]), torch.tensor([[3, 2, 5]])).tolist() == [0, 0, 0]
    assert digit_precision_accuracy(torch.tensor([[2, 2, 5]]), torch.tensor([[2, 2, 7]])).tolist() == [1, 1, 0]
    # exactly opposite directions: 180 degrees; a right angle either way: 90
    errors = direction_error_deg(torch.tensor([[-3, 0], [0, 5], [0, -5], [1, 1]]),
                                 torch.tensor([[3, 0], [7, 0], [7, 0], [0, 0]]))
    assert errors.tolist()[:3] == [180.0, 90.0, 90.0] and math.isnan(errors[3])  # no direction for a zero vector
    # 15.99 s predicted vs 0.01 s true in the 16 s window: -20 ms (pred is 20 ms early), not +15.98 s
    window = 16_000_000_000
    assert wrapped_difference(torch.tensor([15_990_000_000]), torch.tensor([10_000_000]), window).item() == -20_000_000
    assert wrapped_difference(torch.tensor([10_000_000]), torch.tensor([15_990_000_000]), window).item() == 20_000_000


def _sketch_case(kind: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    n = 50_000
    if kind == "mostly_zero":  # issue 9: fewer than 1 / 256 negative, most exactly 0
        x = np.zeros(n)
        x[:100], x[100:500] = -rng.integers(1, 201, 100) * 10, rng.integers(1, 201, 400) * 10
        return x
    if kind == "mostly_zero_both_signs":  # issue 9's 534,890 values: 0.3 % at -10..-2000, 0.3 % at 10..2000
        x = np.zeros(534_890)
        k = int(0.003 * x.size)
        x[:k], x[k:2 * k] = -rng.integers(10, 2001, k), rng.integers(10, 2001, k)
        return x
    if kind == "zeros_then_positives":  # a quartile on the edge of the zeros: ties decide the IQM
        x = np.zeros(n)
        x[:100], x[35_000:] = -rng.integers(1, 201, 100) * 10, rng.integers(1, 40, n - 35_000) * 10
        return x
    if kind == "heavy_tailed":
        return rng.lognormal(0.0, 1.5, n) * np.where(rng.random(n) < 0.7, 1.0, -1.0)
    if kind == "bimodal":
        return np.concatenate([rng.normal(-100, 10, n // 2), rng.normal(80, 5, n - n // 2)])
    if kind == "integer":
        return np.round(rng.standard_t(2, n) * 3) * 10
    if kind == "all_equal":
        return np.full(n, 37.5)
    return np.array([-12.0])  # a single value


@pytest.mark.parametrize("kind", ["mostly_zero", "mostly_zero_both_signs", "zeros_then_positives", "heavy_tailed",
                                  "bimodal", "integer", "all_equal", "single_value"])
def test_sketch_stays_within_its_bounds_of_exact_mode(kind):
    """Quantiles within alpha of the two order statistics they interpolate (relative), the IQM and the CI's hold
    on the exact CI's centre within alpha times the mean |x| of the middle values (README: "Exact vs sketch"),
    on the data where a merged resampling unit used to break (zeros merged with the negatives)."""
    x = _sketch_case(kind)
    spec = SketchSpec(relative_accuracy=0.005)
    counts = sketch_counts(torch.from_numpy(x), spec)
    percents = [100 * q for q in QS]
    reach = np.maximum(*(np.abs(np.percentile(x, percents, method=m)) for m in ("lower", "higher")))
    got_q = sketch_quantile(counts, spec, QS).numpy()
    assert (np.abs(got_q - np.percentile(x, percents)) <= spec.relative_accuracy * reach).all(), got_q
    q25, q75 = np.percentile(x, [25, 75])
    bound = spec.relative_accuracy * np.abs(x[(x >= q25) & (x <= q75)]).mean() + 1e-12
    assert abs(sketch_iqm(counts, spec).item() - np_iqm(x)) <= bound
    exact_ci = bootstrap_iqm_ci(torch.from_numpy(x)).numpy()
    low, high = sketch_bootstrap_iqm_ci(counts, spec).numpy()
    assert low - bound <= exact_ci.mean() <= high + bound, (low, high, exact_ci)


def test_sketch_on_heavy_tailed_signed_data(capsys):
    rng = np.random.default_rng(3)
    n = 3 * 10**5
    x = rng.lognormal(0.0, 1.5, size=n) * np.where(rng.random(n) < 0.7, 1.0, -1.0)
    spec = SketchSpec(relative_accuracy=0.005)
    counts = sketch_counts(torch.from_numpy(x), spec)
    qs = [0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99]
    rel = np.abs(sketch_quantile(counts, spec, qs).numpy() - np.percentile(x, [100 * q for q in qs])) \
        / np.abs(np.percentile(x, [100 * q for q in qs]))
    assert (rel <= spec.relative_accuracy).all(), rel
    assert abs(sketch_iqm(counts, spec).item() - np_iqm(x)) <= 0.01 * abs(np_iqm(x))
    exact_ci = bootstrap_iqm_ci(torch.from_numpy(x))
    sketch_ci = sketch_bootstrap_iqm_ci(counts, spec)
    assert ((sketch_ci - exact_ci).abs() <= 0.02 * exact_ci.abs()).all(), (sketch_ci, exact_ci)
    sizes = {}
    for m in (10**4, 10**5, 10**6):
        values = torch.from_numpy(rng.lognormal(0, 1.5, size=m))
        state = sketch_counts(values, spec)
        sizes[m] = state.numel() * state.element_size()
    with capsys.disabled():
        print("\nsketch state bytes by n:", sizes)
    assert len(set(sizes.values())) == 1


@pytest.mark.parametrize("tail_margin", [4.0, 0.5])
def test_bootstrap_by_sample_compiled_equals_the_vectorized_path(monkeypatch, tail_margin):
    """Nearly all distinct values (sample by sample): the compiled pass (`_count_draws`, `_kept_draws_iqms` over the
    quartiles' zones) gives the resamples' IQMs of the vectorized path (numba off: `draws`, `_iqm_rows`), to
    1e-12 (the sums' order differs)."""
    from owa_metrics.functional import stats

    x = _data("float", 6000, seed=5)
    x = np.concatenate([x, np.full(300, np.round(np.percentile(x, 25))), np.zeros(40)])  # ties at Q25 and the median
    values, counts = distinct(torch.from_numpy(x))
    fast = stats._resample_iqms(values, counts, 200, 42, tail_margin)
    monkeypatch.setattr(stats, "kernel_available", lambda: False)
    vectorized = stats._resample_iqms(values, counts, 200, 42, tail_margin)
    assert not torch.isnan(vectorized).any()
    torch.testing.assert_close(fast, vectorized, rtol=1e-12, atol=1e-12)


def _splitmix_draws(seed: int, resample: int, total: int, size: int) -> list[int]:
    """The sample-by-sample draws from `resample`'s formula, in Python integers: SplitMix64 words
    mix(k + j g), k = mix(seed + (resample + 1) g), each two 32-bit halves (low first) read by Lemire's method."""
    mask, g = 2**64 - 1, 0x9E3779B97F4A7C15

    def mix(z):
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & mask
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & mask
        return z ^ (z >> 31)

    key, out, j = mix((seed + (resample + 1) * g) & mask), [], 0
    while len(out) < size:
        j += 1
        word = mix((key + j * g) & mask)
        for w in (word & 2**32 - 1, word >> 32):
            if (w * total) % 2**32 >= (2**32 - total) % total and len(out) < size:
                out.append(w * total >> 32)
    return out


def test_the_draws_are_splitmix64_read_by_lemires_method():
    """Issue 47: the sample-by-sample draws, in numpy (`draws`) and compiled (`_count_draws`, counting them by
    position in 4 bits of a uint16 per resample), are the documented formula's (a Python oracle): totals where
    Lemire's method skips ~1 word in 10^4 and about half of them, sizes below, at and past a word's two draws;
    each resample has its own stream; positions uniform (chi-square) and independent between resamples."""
    from owa_metrics.functional import resample

    def chi_square_z(observed: np.ndarray) -> float:  # Wilson-Hilferty: the statistic's z-score (df = cells - 1)
        expected, k = observed.sum() / observed.size, observed.size - 1
        statistic = ((observed - expected) ** 2 / expected).sum()
        return ((statistic / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))

    keys = resample.resample_keys(7, 5)
    for total in (3, 1_000_003, 2**31 + 5):
        for i, size in enumerate((0, 1, 2, 9, 5000)):
            want = _splitmix_draws(7, i, total, size)
            assert resample.draws(keys[i], total, size).tolist() == want, (total, size)
            if total < 2**24:
                drawn = np.zeros(total, dtype=np.uint16)
                resample._count_draws(keys[i], total, (2**32 - total) % total, size, drawn, 1 << 4 * (i % 4))
                assert np.array_equal(drawn >> 4 * (i % 4), np.bincount(want, minlength=total).astype(np.uint16))
    assert abs(chi_square_z(np.bincount(resample.draws(keys[0], 1000, 10**6), minlength=1000))) < 4.5
    first, second = (resample.draws(key, 10, 100_000) for key in resample.resample_keys(3, 2))
    assert abs(chi_square_z(np.bincount(10 * first + second, minlength=100))) < 4.5  # pairs: uniform over 10 x 10
    assert not np.array_equal(resample.draws(keys[1], 1000, 100), resample.draws(keys[2], 1000, 100))


def _compiled_layout(x: np.ndarray, resamples: int = 8):
    """The arguments `_kept_resamples` gets for the sample of ``x`` (its layout of zones and values)."""
    from owa_metrics.functional import resample

    seen = {}
    real = resample._kept_resamples

    def spy(*args):
        seen["args"] = args
        return real(*args)

    resample._kept_resamples = spy
    try:
        bootstrap_iqm_ci(torch.from_numpy(x), num_resamples=resamples)
    finally:
        resample._kept_resamples = real
    return seen["args"]


def test_four_resamples_counted_together_give_each_ones_iqm():
    """`_kept_draws_iqms`: up to 4 resamples' counts in 4 bits each of one uint16 per position give each one's IQM
    (numpy's, of its values written out, to 1e-12), an unused resample changing nothing; a position drawn 16 times
    by one resample (a carry into the next one's bits) leaves all 4 not done, never a wrong IQM."""
    from owa_metrics.functional import resample

    x = _data("float", 20_000, seed=3)
    x = np.concatenate([x, np.full(400, np.round(np.percentile(x, 75), 1))])  # ties at Q75
    (_, _, _, groups, r25, right_limit, drawn, slot, middle, kept_values, fine, zone_b, zone_c, pos_b, pos_c,
     left_value, right_value, ranks, t25, t75, _, _) = _compiled_layout(x)
    rng, total = np.random.default_rng(4), drawn.size
    for lanes in (4, 3, 1):
        rows = groups[:lanes]
        counts = [np.bincount(rng.integers(0, total, size=size), minlength=total) for size in rows[:, 1]]
        packed = sum(c.astype(np.int64) << 4 * r for r, c in enumerate(counts))
        for carry in (False, True):
            drawn[:] = packed + (16 if carry else 0) * (np.arange(total) == total // 2)
            sizes, lefts, rights = (np.zeros(4, dtype=np.int64) for _ in range(3))
            sizes[:lanes], lefts[:lanes], rights[:lanes] = rows[:, 1], rows[:, 0], rows[:, 2]
            iqms, done = np.empty(4), np.zeros(4, dtype=np.bool_)
            resample._kept_draws_iqms(drawn, sizes, slot, middle, kept_values, fine, zone_b, zone_c, pos_b, pos_c,
                                      lefts, left_value, rights, right_value, ranks, t25, t75, iqms, done)
            assert not drawn.any()
            if carry:
                assert not done.any()
                continue
            assert done[:lanes].all()
            for r in range(lanes):
                values = np.concatenate([np.full(rows[r, 0], left_value), np.repeat(kept_values[slot], counts[r]),
                                           np.full(rows[r, 2], right_value)])
                assert close(iqms[r], np_iqm(values), 1e-12), (lanes, r)


@pytest.mark.parametrize("kind, n, tail_margin", [("float", 1, 4.0), ("equal", 500, 4.0), ("float", 300, 4.0),
                                                  ("ties", 3000, 4.0), ("quartile ties", 30_000, 4.0),
                                                  ("float", 30_000, 0.5)])
def test_bootstrap_sample_by_sample_equals_the_oracle(kind, n, tail_margin):
    """The compiled bootstrap (sample by sample: most values distinct) within the textbook bootstrap's Monte-Carlo
    band (`np_bootstrap_ci`): one value, all equal (counts by value), just past the sample-by-sample threshold,
    ties, and many values with ties at both quartiles and the median; at tail_margin 0.5 some resamples' tails
    reach a quartile (about 1 in 5 here): those are read from their counts, drawn again (`draws`)."""
    x = _data("float", n, seed=n) if kind in ("float", "quartile ties") else _data("ties", n) if kind == "ties" \
        else np.full(n, 2.5)
    if kind == "quartile ties":
        x = np.concatenate([x, np.repeat(np.round(np.percentile(x, [25, 50, 75]), 1), 600)])
    got = bootstrap_iqm_ci(torch.from_numpy(x), num_resamples=200, tail_margin=tail_margin).numpy()
    want = np_bootstrap_ci(x, resamples=200, oracle_resamples=1000)
    assert close(got[0], want[0], 1e-12) and close(got[1], want[1], 1e-12), (got, want)


@pytest.mark.parametrize("hashed", [None, 8])
@pytest.mark.parametrize("zeros", ["none", "one sign", "both signs"])
def test_distinct_by_group_equals_a_sort_of_each_group_and_of_all(zeros, hashed, monkeypatch):
    """Issue 34: per column, each group's distinct values and counts, and the pooled ones merged from them, are
    numpy's ``unique`` of the group's values and of the whole column (NaNs left out), bit for bit; with 0.0 and -0.0
    both in a column its pooled ones are `distinct`'s own (which zero stands for both is its sort's); an empty group
    is empty; a group code out of range gives the masks' answer. ``hashed``: a group with more distinct values than
    that is sorted instead of counted in the hash table (the default limit holds every group here)."""
    from owa_metrics.functional import stats
    from owa_metrics.functional.stats import distinct_by_group

    if hashed is not None:
        monkeypatch.setattr(stats, "HASHED_DISTINCT", hashed)

    rng = np.random.default_rng(3)
    x = np.round(rng.standard_t(2, 5000) * 3) * 10
    x[rng.random(x.size) < 0.05] = np.nan
    x[x == 0] = {"none": 7.5, "one sign": -0.0, "both signs": 0.0}[zeros]
    if zeros == "both signs":
        x[:40][x[:40] == 0] = -0.0
    other = rng.integers(-3, 4, x.size) * 0.5  # a second column: 0.0 only
    group = rng.choice([0, 1, 3], size=x.size).astype(np.float64)  # group 2: empty
    rows = torch.from_numpy(np.stack([x, other, group], axis=1))  # strided columns, as the metric's rows
    read = distinct_by_group(rows[:, :2], rows[:, 2], 4)
    assert len(read) == 2

    def unique(v):
        values, counts = np.unique(v[~np.isnan(v)], return_counts=True)
        return values, counts.astype(np.float64)

    for column, (by_group, pooled) in zip((x, other), read):
        for g in range(4):
            want = unique(column[group == g])
            assert np.array_equal(by_group[g][0].numpy(), want[0]) and np.array_equal(by_group[g][1].numpy(), want[1])
            assert by_group[g][0].dtype == by_group[g][1].dtype == torch.float64
        assert by_group[2][0].numel() == 0
        want = unique(column)
        assert np.array_equal(pooled[0].numpy(), want[0]) and np.array_equal(pooled[1].numpy(), want[1])
    pooled = read[0][1][0].numpy()
    assert list(np.signbit(pooled[pooled == 0])) == {"none": [], "one sign": [True], "both signs": list(np.signbit(
        distinct(rows[:, 0], drop_nan=True)[0].numpy()[unique(x)[0] == 0]))}[zeros]
    outside = rows.clone()
    outside[5, 2] = 4.0
    for j, (by_group, pooled) in enumerate(distinct_by_group(outside[:, :2], outside[:, 2], 4)):
        for g in range(4):
            assert torch.equal(by_group[g][0], distinct(outside[outside[:, 2] == g, j], drop_nan=True)[0])
        assert torch.equal(pooled[1], distinct(outside[:, j], drop_nan=True)[1])
    for empty in (rows[:0], torch.tensor([[np.nan, 0.0, 1.0]], dtype=torch.float64)):  # no rows, only NaN
        by_group, pooled = distinct_by_group(empty[:, :1], empty[:, 2], 4)[0]
        for values, counts in [*by_group, pooled]:
            assert values.numel() == counts.numel() == 0 and values.dtype == counts.dtype == torch.float64


def _bits(x: torch.Tensor) -> list:
    """The float64 values' bit patterns (equal NaNs, and 0.0 apart from -0.0)."""
    return x.numpy().view(np.int64).tolist()


def _shares(kind: str, rng: np.random.Generator) -> np.ndarray:
    """Shares of kept values as the bootstrap draws them: a few big ones among many tiny ones (inversion and BTPE,
    each side of 1/2, BTPE's Stirling test far from its mode), uniform, one dominant, one value, two."""
    if kind == "mixed":
        counts = np.where(rng.random(700) < 0.15, rng.integers(30, 5000, 700), rng.integers(1, 4, 700))
        counts[rng.integers(0, 700)] = 200_000
    else:
        counts = {"uniform": np.ones(50), "dominant": np.array([1, 3, 10_000_000, 2, 1]), "one": np.array([5]),
                  "two": np.array([3, 1])}[kind]
    return counts / counts.sum()


@pytest.mark.parametrize("kind", ["mixed", "uniform", "dominant", "one", "two"])
def test_the_compiled_multinomial_is_numpys(kind):
    """Issue 34, 47: `multinomial_rows` (numba's own ``Generator.binomial``, value after value, compiled) draws what
    numpy's own ``Generator.multinomial`` draws from the same generator, row after row, over many seeds and sample
    sizes (0, 1, small, 10^5, 10^8), a 32-bit word left over in the generator or not, and leaves the generator where
    numpy's is (the next draws equal)."""
    from owa_metrics.functional import resample

    for seed in range(12):
        rng = np.random.default_rng(seed)
        shares = _shares(kind, rng)
        numpys, mine = np.random.default_rng(seed), np.random.default_rng(seed)
        if seed % 2:
            numpys.integers(0, 100, size=1), mine.integers(0, 100, size=1)  # a word left over
        sizes = [rng.integers(0, 300_000, 40), np.array([0, 1, 2, 10**5, 10**8]), rng.integers(0, 40, 30)]
        for size in sizes:
            got = resample.multinomial_rows(mine, size, shares, compiled=True)
            assert np.array_equal(got, numpys.multinomial(size, shares)), (kind, seed, size)
        assert mine.bit_generator.state == numpys.bit_generator.state
        assert mine.random() == numpys.random()


def test_the_kept_counts_weighted_give_each_resamples_iqm():
    """`_covered_rows`: per row of counts, the quartiles and the counts in [Q25, Q75] times their values; their sum
    over the count is numpy's IQM of the row's values written out (1e-12), and `_iqm_rows`' value bit for bit
    (torch sums the same weighted counts); small rows (n = 1, 2, 3: quartile ranks out of order) included."""
    from owa_metrics.functional import stats

    rng = np.random.default_rng(8)
    values = np.sort(rng.choice(np.round(rng.standard_t(2, 400) * 7, 1), 60, replace=False))
    for n in (1, 2, 3, 10, 997):
        counts = rng.multinomial(n, rng.dirichlet(np.full(values.size, 0.3)), size=25)
        h = [0.25 * (n - 1), 0.75 * (n - 1)]
        lo = [math.floor(x) for x in h]
        ranks, weights = np.array([lo[0], min(lo[0] + 1, n - 1), lo[1], min(lo[1] + 1, n - 1)]), np.array(h) - lo
        weighted, covered = np.empty(counts.shape), np.empty(len(counts))
        stats._covered_rows(values, counts, ranks, weights, weighted, covered)
        got = torch.from_numpy(weighted).sum(-1) / torch.from_numpy(covered)
        want = stats._iqm_rows(torch.from_numpy(values), torch.from_numpy(counts).double())
        assert _bits(got) == _bits(want), n
        for row, iqm_ in zip(counts, got):
            assert close(iqm_, np_iqm(np.repeat(values, row)), 1e-12), n


@pytest.mark.parametrize("tail_margin", [4.0, 0.0])
def test_bootstrap_by_value_compiled_equals_numpys_draws_and_the_torch_path(monkeypatch, tail_margin):
    """The kept counts drawn value by value: the compiled multinomial and IQMs give the resamples' IQMs of numpy's
    own draws read by `_iqm_rows` (the kernels off) bit for bit, tails split (tail_margin 0) or not."""
    from owa_metrics.functional import stats

    for kind, n in (("ties", 5000), ("integer", 3000)):
        values, counts = distinct(torch.from_numpy(_data(kind, n)))
        fast = stats._resample_iqms(values, counts, 300, 42, tail_margin)
        with monkeypatch.context() as m:
            m.setattr(stats, "kernel_available", lambda: False)
            slow = stats._resample_iqms(values, counts, 300, 42, tail_margin)
        assert _bits(fast) == _bits(slow), kind
