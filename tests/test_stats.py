import math

import numpy as np
import pytest
import torch

from owa_metrics.functional.events import digit_precision_accuracy, direction_error_deg, wrapped_difference
from owa_metrics.functional.stats import (
    SketchSpec, bootstrap_iqm_ci, iqm, quantile, sketch_bootstrap_iqm_ci, sketch_counts, sketch_iqm, sketch_quantile,
)
from oracles import close, np_bootstrap_ci, np_iqm


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


def test_iqm_is_the_mean_inside_the_quartiles_not_of_the_quartiles():
    x = torch.tensor([0.0, 1, 2, 3, 100])  # Q25 = 1, Q75 = 3 -> mean(1, 2, 3) = 2
    assert iqm(x).item() == 2.0
    assert torch.isnan(iqm(torch.tensor([]))) and torch.isnan(bootstrap_iqm_ci(torch.tensor([]))).all()


def test_bootstrap_depends_on_the_values_not_their_order():
    x = torch.randn(500, dtype=torch.float64)
    assert torch.equal(bootstrap_iqm_ci(x), bootstrap_iqm_ci(x.flip(0)))
    assert not torch.equal(bootstrap_iqm_ci(x), bootstrap_iqm_ci(x, seed=7))


def test_quantile_past_torch_quantile_limit():
    n = (1 << 24) + 3  # torch.quantile refuses inputs this large
    x = torch.from_numpy(np.random.default_rng(0).random(n))
    with pytest.raises(RuntimeError):
        torch.quantile(x, 0.5)
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


def test_sketch_on_heavy_tailed_signed_data(capsys):
    rng = np.random.default_rng(3)
    n = 10**6
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
    for m in (10**4, 10**5, 10**6, 10**7):
        values = torch.from_numpy(rng.lognormal(0, 1.5, size=m))
        state = sketch_counts(values, spec)
        sizes[m] = state.numel() * state.element_size()
    with capsys.disabled():
        print("\nsketch state bytes by n:", sizes)
    assert len(set(sizes.values())) == 1
