"""The torch path on a CUDA device, where it is the default: skipped without one (CI has none; run them on a GPU
machine with ``python -m pytest tests/test_cuda.py``). States and report equal the CPU kernel's on corrupted
batches; the token loss runs in blocks of bounded memory; an update makes the host wait at most where
tests/test_op_counts.py says it would."""

import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from owa_metrics import OWAEventMetrics
from owa_metrics.functional import tokens
from owa_metrics.functional.tokens import LOSS_BLOCK_LOGITS, dense_token_losses, token_losses
from test_decode import batch_tensors, batches

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_decode import make_batch  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def _states(metric) -> dict[str, torch.Tensor]:
    out = {}
    for name in metric._defaults:
        value = getattr(metric, name)
        value = (torch.cat(value) if value else torch.zeros(0)) if isinstance(value, list) else value
        out[name] = value.detach().cpu().double()
    return out


def _assert_same(gpu, cpu, label):
    """Counts exactly; float states to 1e-12 relative (the GPU's own norm and atan2 may differ in the last bit); the
    token losses, float32 cross-entropies summed in another order, to 1e-5; then every report key likewise."""
    got, want = _states(gpu), _states(cpu)
    for name, value in want.items():
        rtol = 1e-5 if name == "token_loss" else 1e-12
        torch.testing.assert_close(got[name], value, rtol=rtol, atol=0, equal_nan=True, msg=f"{label} {name}")
    got, want = gpu.compute(), cpu.compute()
    assert set(got) == set(want), label
    for key, value in want.items():
        rtol = 1e-5 if "loss" in key else 1e-9
        torch.testing.assert_close(got[key].cpu(), value, rtol=rtol, atol=0, msg=f"{label} {key}")


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_gpu_states_and_report_equal_the_cpu_kernel(format_vocab, data):
    alignment = data.draw(st.sampled_from(["teacher_forcing", "generation"]))
    pairing = data.draw(st.sampled_from(["index", "time"])) if alignment == "generation" else "index"
    pred, target = batch_tensors(*data.draw(batches(format_vocab, alignment)), alignment)
    logits = None
    if alignment == "teacher_forcing" and data.draw(st.booleans(), label="with logits"):
        dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
        logits = torch.randn(*target.shape, format_vocab.size + 3, generator=torch.Generator().manual_seed(1)).to(dtype)
    d2e = {"bin_ms": 50, "bin_shifts": (-1, 1)} if data.draw(st.booleans(), label="D2E bins") else {}
    for mode in ("exact", "sketch"):
        options = dict(vocab=format_vocab, alignment=alignment, mode=mode, pairing=pairing, **d2e)
        cpu, gpu = OWAEventMetrics(**options), OWAEventMetrics(**options).to(CUDA)
        for _ in range(2):
            cpu.update(pred, target, logits=None if logits is None else logits.float())
            gpu.update(pred.to(CUDA), target.to(CUDA), logits=None if logits is None else logits.to(CUDA))
        _assert_same(gpu, cpu, f"{alignment} {pairing} {mode}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_loss_on_the_gpu_equals_the_cpu(dtype):
    """A vocabulary of 1,000, blocks of 7 positions; labels past it, ignored labels and a NaN logit."""
    g = torch.Generator().manual_seed(0)
    target = torch.randint(-20, 1010, (3, 50), generator=g)
    target = torch.where(target < 0, -100, target)
    logits = torch.randn(3, 50, 1000, generator=g).to(dtype)
    logits[1, 2, 5] = float("nan")
    want_loss, want_skipped = token_losses(logits.float(), target, chunk_rows=16)
    got_loss, got_skipped = dense_token_losses(logits.to(CUDA), target.to(CUDA), block_logits=7 * 1000)
    torch.testing.assert_close(got_loss.cpu(), want_loss, rtol=1e-6, atol=1e-6)
    assert float(got_skipped) == float(want_skipped) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fused_block_loss_equals_the_torch_ops(dtype):
    """`fused_block_cross_entropy` (torch.compile: one Triton reduction a row) compiles here and equals the eager
    log-sum-exp minus the label's logit and the float32 cross-entropy to 1e-5, at a 151,936-wide vocabulary and a
    NaN logit; blocks of two sizes (the last block of a batch is shorter)."""
    g = torch.Generator().manual_seed(1)
    for rows in (64, 37):
        logits = (torch.randn(rows, 151_936, generator=g) * 3).to(dtype).to(CUDA)
        labels = torch.randint(0, 151_936, (rows,), generator=g).to(CUDA)
        logits[3, 11] = float("nan")
        got = tokens.fused_block_cross_entropy(logits, labels)
        assert "failed" not in tokens._fused, tokens._fused.get("failed")
        eager = tokens.block_cross_entropy(logits, labels)
        before = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
        assert torch.isnan(got[3]) and torch.isnan(before[3])
        for want in (eager, before):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_wide_vocabulary_logits_take_one_block_of_memory(tokenizer):
    """8,192 positions of 151,936-column bfloat16 logits (2.5 GB): the update allocates a block's float32 copy and
    log-softmax (2 x 512 MB) and small tensors, not a float32 copy of the whole logits (5 GB, and as much again)."""
    preds, target = make_batch(OWAEventMetrics(tokenizer).vocab, 4, 2048)
    logits = torch.randn(4, 2048, 151_936, device=CUDA, dtype=torch.bfloat16)
    metric = OWAEventMetrics(tokenizer).to(CUDA)
    preds, target = preds.to(CUDA), target.to(CUDA)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    metric.update(preds, target, logits)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < 2 * 4 * LOSS_BLOCK_LOGITS + 256 * 2**20
    assert float(metric.token_loss_events.sum()) > 0  # events whose token loss was summed


@pytest.mark.parametrize("case, limit", [({}, 2), ({"mode": "sketch"}, 1), ({"logits": True}, 2),
                                         ({"alignment": "generation"}, 2),
                                         ({"alignment": "generation", "pairing": "time"}, 2),
                                         ({"bin_ms": 50, "bin_shifts": (-1, 1)}, 2),
                                         ({"mode": "sketch", "bin_ms": 50}, 1),
                                         ({"alignment": "generation", "pairing": "time", "bin_ms": 50}, 2)])
def test_an_update_makes_the_host_wait_at_most_as_counted(tokenizer, case, limit):
    """``torch.cuda.set_sync_debug_mode`` warns at every call that makes the host wait for the device (reads of
    values, data-sized outputs, copies from pageable host memory)."""
    options = {k: v for k, v in case.items() if k != "logits"}
    preds, target = make_batch(OWAEventMetrics(tokenizer).vocab, 8, 1024)
    args = [preds.to(CUDA), target.to(CUDA)]
    if case.get("logits"):
        args.append(torch.randn(*target.shape, len(tokenizer), device=CUDA))
    metric = OWAEventMetrics(tokenizer, **options).to(CUDA)
    metric.update(*args)  # the tables are made and copied to the device once, here
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            metric.update(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    assert 0 < len(waits) <= limit, waits
