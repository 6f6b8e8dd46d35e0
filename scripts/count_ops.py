"""Torch ops and host syncs of one `OWAEventMetrics.update` on the torch path (``backend="torch"``, CPU tensors).

    python scripts/count_ops.py [--batch 32 --seq-len 2048]

Cases: teacher forcing in exact mode, in sketch mode, with logits [B, T, V] (exact mode), and generation
(``pairing="index"``, exact mode), on the batch `bench_decode.make_batch` builds (a simulated session, 5 % of
the predicted tokens replaced), after one warm-up update.

- ops: `torch.profiler` events of the update whose name starts with ``aten::`` and that have no ``aten::``
  ancestor (an op called by another op is not counted; an op the Python code calls is, however small). Of them,
  ``views``: the ops that only make a view (`VIEWS`: no kernel on a GPU, a few µs of host time each).
- syncs: the aten calls a `SyncCounter` (a ``TorchDispatchMode``) sees whose result needs the host to wait for
  the device: reading a value (``_local_scalar_dense``: ``.item()``, ``bool()``, ``int()``), an output whose
  shape depends on the data (`nonzero`, `masked_select`, `unique*`, ``repeat_interleave`` without
  ``output_size``, indexing or ``index_put_`` with a boolean mask), `bincount` / `histc`, whose CUDA kernels
  read the input's range on the host, and the Tensor methods that read data on the host (`HOST_READS`). On the CPU nothing waits; these are the calls that would on a GPU.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten.item.default, aten.equal.default, aten.is_nonzero.default}
DATA_SHAPED = {aten.nonzero.default, aten.masked_select.default, aten.unique_consecutive.default,
               aten.unique_dim.default, aten._unique.default, aten._unique2.default, aten.bincount.default,
               aten.histc.default}
MASK_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
HOST_READS = ("tolist", "numpy")  # Tensor methods that read the data on the host (a copy to it, on a GPU)
REPEATS = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
VIEWS = {f"aten::{name}" for name in ("view", "select", "slice", "unbind", "squeeze", "unsqueeze", "expand", "permute",
                                      "numpy_T", "t", "transpose", "split", "split_with_sizes", "as_strided", "alias",
                                      "detach", "view_as", "diagonal")}


class SyncCounter(TorchDispatchMode):
    """Counts, by op name, the aten calls that would make the host wait for a GPU (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __enter__(self):  # reading a tensor into Python or numpy dispatches no aten op on the CPU: counted here
        self._saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, self._counting(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _counting(self, name, method):
        def read(tensor, *args, **kwargs):
            self.calls[name] += 1
            return method(tensor, *args, **kwargs)
        return read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or func in DATA_SHAPED or self._masked(func, args) or (
                func in REPEATS and kwargs.get("output_size") is None):
            self.calls[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)

    @staticmethod
    def _masked(func, args) -> bool:
        if func not in MASK_INDEXED or len(args) < 2:
            return False
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def top_level_ops(fn) -> Counter:
    """``aten::`` profiler events of one call of ``fn`` without an ``aten::`` ancestor, by name."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    out = Counter()
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            out[event.name] += 1
    return out


def count(fn) -> tuple[Counter, Counter]:
    """``(top-level ops, syncs)`` of one call of ``fn`` each (two calls)."""
    ops = top_level_ops(fn)
    with SyncCounter() as syncs:
        fn()
    return ops, syncs.calls


def cases(batch: int, seq_len: int):
    """``{name: update call}`` of the four torch-path cases on one simulated batch (each warmed up once)."""
    from owa_metrics import OWAEventMetrics, build_tokenizer

    from bench_decode import make_batch  # scripts/ is on sys.path when run as a script

    tokenizer = build_tokenizer()
    preds, target = make_batch(OWAEventMetrics(tokenizer).vocab, batch, seq_len)
    logits = torch.randn(*target.shape, len(tokenizer), generator=torch.Generator().manual_seed(0))
    setups = {"teacher forcing, exact": ({}, (preds, target)),
              "teacher forcing, sketch": ({"mode": "sketch"}, (preds, target)),
              "teacher forcing, logits": ({}, (preds, target, logits)),
              "generation (index)": ({"alignment": "generation"}, (preds, target))}
    out = {}
    for name, (options, args) in setups.items():
        metric = OWAEventMetrics(tokenizer, backend="torch", **options)
        metric.update(*args)
        out[name] = lambda metric=metric, args=args: metric.update(*args)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--detail", action="store_true", help="list the ops and syncs by name")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, batch {args.batch} x {args.seq_len}, backend='torch' on CPU")
    print(f"{'case':<26} {'top-level ops':>13} {'views':>6} {'syncs':>6}  sync ops")
    for name, fn in cases(args.batch, args.seq_len).items():
        ops, syncs = count(fn)
        listed = ", ".join(f"{k} {v}" for k, v in sorted(syncs.items())) or "-"
        views = sum(v for k, v in ops.items() if k in VIEWS)
        print(f"{name:<26} {sum(ops.values()):>13} {views:>6} {sum(syncs.values()):>6}  {listed}")
        if args.detail:
            print("    " + ", ".join(f"{k[6:]} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
