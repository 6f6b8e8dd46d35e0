"""Torch ops and host syncs of one `OWAEventMetrics.update` on the torch path (``backend="torch"``, CPU tensors).

    python scripts/count_ops.py [--batch 32 --seq-len 2048]

Cases (`SETUPS`): teacher forcing and generation paired by index and by time, in exact and sketch mode, with
logits [B, T, V] or a token loss [B, T], with the D2E protocol (``bin_ms=50``), on the batch
`bench_decode.make_batch` builds (a simulated session, 5 % of the predicted tokens replaced), after one warm-up
update.

- ops: `torch.profiler` events of the update whose name starts with ``aten::`` and that have no ``aten::``
  ancestor (an op called by another op is not counted; an op the Python code calls is, however small). Of them,
  ``views``: the ops that only make a view (`VIEWS`: no kernel on a GPU, a few µs of host time each).
- syncs: the aten calls a `SyncCounter` (a ``TorchDispatchMode``) sees whose result needs the host to wait for
  the device: reading a value (``_local_scalar_dense``: ``.item()``, ``bool()``, ``int()``), an output whose
  shape depends on the data (`nonzero`, `masked_select`, `unique*`, ``repeat_interleave`` without
  ``output_size``, indexing or ``index_put_`` with a boolean mask), `bincount` / `histc`, whose CUDA kernels
  read the input's range on the host, and the Tensor methods that read data on the host (`HOST_READS`). On the CPU nothing waits; these are the calls that would on a GPU.
  Copies between the host and the device (``_to_copy`` / ``copy_`` from a CPU tensor to another device, or back,
  outside a counted read): on a GPU run they are counted too (``to_device`` / ``to_host``: CUDA's sync debug mode
  warns at them); on a CPU run every tensor is on the host and no such copy happens. What stands for them there,
  with ``host_data=True`` (`count`, the cases below): a tensor made of Python or numpy data during the call
  (``torch.tensor(list)``, ``torch.from_numpy`` / ``torch.as_tensor`` of an array, a Python number set into a
  tensor: each dispatches ``lift_fresh``), which a GPU update would copy to the device from pageable memory.
  Not seen on the CPU: a CPU tensor made by a factory without ``device=`` and moved with ``.to(device)``; the
  module's code has none (it makes every tensor on its inputs' device).
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
TO_COPY = {aten._to_copy.default}
COPIES = TO_COPY | {aten.copy_.default}  # between the host and a device: counted by the devices of their tensors
VIEWS = {f"aten::{name}" for name in ("view", "select", "slice", "unbind", "squeeze", "unsqueeze", "expand", "permute",
                                      "numpy_T", "t", "transpose", "split", "split_with_sizes", "as_strided", "alias",
                                      "detach", "view_as", "diagonal")}


class SyncCounter(TorchDispatchMode):
    """Counts, by op name, the aten calls that would make the host wait for a GPU (see the module docstring);
    ``host_data``: also the tensors made of Python or numpy data (``lift_fresh``), which a GPU update would copy to
    the device."""

    def __init__(self, host_data: bool = False):
        super().__init__()
        self.calls: Counter = Counter()
        self.host_data, self._reading = host_data, 0

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
            self._reading += 1  # its own copy to the host (on a GPU) is this read
            try:
                return method(tensor, *args, **kwargs)
            finally:
                self._reading -= 1
        return read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or func in DATA_SHAPED or self._masked(func, args) or (
                func in REPEATS and kwargs.get("output_size") is None):
            self.calls[str(func.overloadpacket.__name__)] += 1
        elif func in COPIES and not self._reading:
            source, target = (args[0].device, kwargs.get("device") or args[0].device) if func in TO_COPY else (
                args[1].device, args[0].device)
            if (source.type == "cpu") != (torch.device(target).type == "cpu"):
                self.calls["to_device" if source.type == "cpu" else "to_host"] += 1
        elif func == aten.lift_fresh.default and self.host_data:
            self.calls["lift_fresh"] += 1
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
    with SyncCounter(host_data=True) as syncs:
        fn()
    return ops, syncs.calls


# every alignment and pairing, mode, loss input and the D2E protocol: {name: (OWAEventMetrics options, update input)}
SETUPS = {"teacher forcing, exact": ({}, "ids"),
          "teacher forcing, sketch": ({"mode": "sketch"}, "ids"),
          "teacher forcing, logits": ({}, "logits"),
          "teacher forcing, sketch, logits": ({"mode": "sketch"}, "logits"),
          "teacher forcing, token_loss": ({}, "token_loss"),
          "teacher forcing, sketch, token_loss": ({"mode": "sketch"}, "token_loss"),
          "teacher forcing, d2e": ({"bin_ms": 50}, "ids"),
          "teacher forcing, sketch, d2e": ({"mode": "sketch", "bin_ms": 50}, "ids"),
          "generation (index)": ({"alignment": "generation"}, "ids"),  # the D2E bins on by default
          "generation (index), sketch": ({"alignment": "generation", "mode": "sketch"}, "ids"),
          "generation (index), d2e": ({"alignment": "generation", "bin_ms": 50}, "ids"),
          "generation (index), no d2e": ({"alignment": "generation", "bin_ms": None}, "ids"),
          "generation (index), sketch, no d2e": ({"alignment": "generation", "mode": "sketch", "bin_ms": None}, "ids"),
          "generation (time)": ({"alignment": "generation", "pairing": "time"}, "ids"),
          "generation (time), sketch": ({"alignment": "generation", "pairing": "time", "mode": "sketch"}, "ids"),
          "generation (time), d2e": ({"alignment": "generation", "pairing": "time", "bin_ms": 50}, "ids"),
          "generation (time), no d2e": ({"alignment": "generation", "pairing": "time", "bin_ms": None}, "ids"),
          "generation (time), sketch, no d2e": ({"alignment": "generation", "pairing": "time", "mode": "sketch",
                                                 "bin_ms": None}, "ids")}


def cases(batch: int, seq_len: int, names=None):
    """``{name: update call}`` of the torch-path cases (`SETUPS`, or those ``names``) on one simulated batch (each
    warmed up once)."""
    from owa_metrics import OWAEventMetrics, build_tokenizer

    from bench_decode import make_batch  # scripts/ is on sys.path when run as a script

    tokenizer = build_tokenizer()
    preds, target = make_batch(OWAEventMetrics(tokenizer).vocab, batch, seq_len)
    g = torch.Generator().manual_seed(0)
    inputs = {"ids": {}, "logits": {"logits": torch.randn(*target.shape, len(tokenizer), generator=g)},
              "token_loss": {"token_loss": torch.rand(target.shape, generator=g) * 5}}
    out = {}
    for name in names or SETUPS:
        options, given = SETUPS[name]
        metric = OWAEventMetrics(tokenizer, backend="torch", **options)
        metric.update(preds, target, **inputs[given])
        out[name] = lambda metric=metric, given=inputs[given]: metric.update(preds, target, **given)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--detail", action="store_true", help="list the ops and syncs by name")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, batch {args.batch} x {args.seq_len}, backend='torch' on CPU")
    print(f"{'case':<36} {'top-level ops':>13} {'views':>6} {'syncs':>6}  sync ops")
    for name, fn in cases(args.batch, args.seq_len).items():
        ops, syncs = count(fn)
        listed = ", ".join(f"{k} {v}" for k, v in sorted(syncs.items())) or "-"
        views = sum(v for k, v in ops.items() if k in VIEWS)
        print(f"{name:<36} {sum(ops.values()):>13} {views:>6} {sum(syncs.values()):>6}  {listed}")
        if args.detail:
            print("    " + ", ".join(f"{k[6:]} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
