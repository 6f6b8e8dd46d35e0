"""Every Python block of docs/*.md runs as written and does what its text says (issue 44 item 7; the README's blocks:
tests/test_readme.py). A block that goes on from another (a fragment) runs after a hidden prelude, given per block
below `BLOCKS`: the names the doc says it takes from elsewhere. No block is left out (none needs a GPU, the network or
a long training: the models are tiny, built from configs). Also: the one line numba's first compile logs, and the
error `token_sequences` gives a tokenizer without image tokens."""

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"```python\n(.*?)```", re.S)

# name: (doc, a string only its block holds). The hidden preludes of the fragments:
# - the VLM families after InternVL: InternVL's names (imports, `Agent`), its stand-in tokenizer built with the
#   words of the block's `# tokenizer: words = [...]` line, as that line says;
# - Qwen2.5-VL: the Qwen2-VL block's names (tokenizer, `ids`, data, callback), as its text says;
# - MLflow: the README's Lightning block up to its callback (tokenizer, `Agent`, model, loader), as its text says.
BLOCKS = {
    "internvl": ("VLM.md", "InternVLConfig("),
    "llava": ("VLM.md", "LlavaConfig("),
    "smolvlm": ("VLM.md", "Idefics3Config("),
    "qwen2-vl": ("VLM.md", "Qwen2VLConfig("),
    "qwen2.5-vl": ("VLM.md", "Qwen2_5_VLConfig("),
    "register": ("METRICS.md", "register(Definition("),
    "mlflow": ("TRAINING.md", "MLFlowLogger("),
}


def _all_blocks() -> list[tuple[str, str]]:
    return [(doc.name, code) for doc in sorted((ROOT / "docs").glob("*.md")) for code in FENCE.findall(doc.read_text())]


def _code(name: str) -> str:
    doc, marker = BLOCKS[name]
    found = [code for d, code in _all_blocks() if d == doc and marker in code]
    assert len(found) == 1, f"docs/{doc}: expected one Python block with {marker!r}"
    return found[0]


def _exec(name: str, namespace: dict) -> dict:
    exec(compile(_code(name), f"docs/{BLOCKS[name][0]} ({name} block)", "exec"), namespace)
    return namespace


def test_every_python_block_of_the_docs_is_run_here():
    run = {_code(name) for name in BLOCKS}
    missed = [f"docs/{doc}: {code.splitlines()[0]!r}" for doc, code in _all_blocks() if code not in run]
    assert not missed, f"Python blocks no test runs (add each to BLOCKS, with its prelude and a check): {missed}"


@contextlib.contextmanager
def _in(folder: Path):
    """The block's working directory (what it writes lands there)."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    """The InternVL block's names after it ran (both validations), and what it printed."""
    printed = io.StringIO()
    with _in(tmp_path_factory.mktemp("internvl")), contextlib.redirect_stdout(printed):
        namespace = _exec("internvl", {})
    return namespace, printed.getvalue()


def _family(name: str, base: dict) -> dict:
    """``base``'s names and the stand-in tokenizer of the InternVL block, built with the words the block names."""
    code = _code("internvl")
    stand_in = code[code.index("backend = Tokenizer("):code.index("# the model:")]
    words = re.search(r"^# tokenizer: words = (\[.*\])", _code(name), re.M).group(1)
    namespace = dict(base)
    exec(f"words = {words}\n{stand_in}", namespace)
    return namespace


def _validate(namespace: dict, data: list) -> dict:
    """The block's model, data and callback through the InternVL block's `Agent` and `trainer.validate`."""
    import lightning as L

    loader = torch.utils.data.DataLoader(data, batch_size=2, collate_fn=namespace["collate"])
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[namespace["callback"]], enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.validate(namespace["Agent"](namespace["model"]), loader)
    return namespace["callback"].reported


def _targets(namespace: dict, data: list) -> int:
    """Generation's target events: the last predict_events=3 actions of each sequence (screens are context), the
    prompt keeping at least its first; counted from the ids: an action is an ``<EVENT_START>`` not followed by
    ``<SCREEN>``."""
    ids = namespace["vocab"].ids
    actions = [int(((x["input_ids"][:-1] == ids["<EVENT_START>"]) & (x["input_ids"][1:] != ids["<SCREEN>"])).sum())
               for x in data]
    return sum(min(3, n - 1) for n in actions if n)


def test_the_internvl_block_validates_by_teacher_forcing_and_generation(internvl):
    namespace, printed = internvl
    results = [line for line in printed.splitlines() if line.startswith("[{")]
    assert len(results) == 2 and all("'val/owa/comparable_rate'" in line for line in results)
    assert namespace["callback"].reported["val/owa/count/target_events"] == _targets(namespace, namespace["data"])


@pytest.fixture(scope="module")
def qwen2_vl(internvl, tmp_path_factory):
    with _in(tmp_path_factory.mktemp("qwen2_vl")):
        return _exec("qwen2-vl", _family("qwen2-vl", internvl[0]))


@pytest.mark.parametrize("name", ["llava", "smolvlm", "qwen2-vl", "qwen2.5-vl"])
def test_each_vlm_family_block_generates_from_its_images(name, internvl, qwen2_vl, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if name == "qwen2-vl":
        namespace = qwen2_vl
    elif name == "qwen2.5-vl":
        namespace = _exec(name, dict(qwen2_vl))
    else:
        namespace = _exec(name, _family(name, internvl[0]))
    data = list(namespace["data"])
    if name.startswith("qwen"):  # and a sequence without screens, its inputs made by the block's own loop
        code = _code("qwen2-vl")
        loop = code[code.index("for item in data:"):code.index("callback = ")]
        vocab = namespace["vocab"]
        events = [e for e in namespace["simulate_session"](12, seed=1, format="factorized") if e.kind != "screen"]
        extra = namespace["token_sequences"](vocab, events, 400)[:1]
        exec(loop, {**namespace, "data": extra})
        assert extra[0]["image_grid_thw"].shape == (0, 3)
        data = [data[0], *extra, *data[1:]]  # the first batch: one item with screens, one without
    reported = _validate(namespace, data)
    assert reported["val/owa/count/target_events"] == _targets(namespace, data)


def test_the_register_block_adds_its_keys_to_every_new_metric(tmp_path, monkeypatch):
    """Two mouse moves, dx -3 and 10 predicted +2 and 10: |dx error| 5 and 0, their mean 2.5 over 2 events."""
    from owa_metrics import EventCodec, OWAEventMetrics, build_tokenizer
    from owa_metrics.functional.report import unregister
    from owa_metrics.schema import Event

    monkeypatch.chdir(tmp_path)
    tokenizer = build_tokenizer()
    codec = EventCodec()
    ids = lambda *dx: torch.tensor([tokenizer("".join(  # noqa: E731
        codec.encode(Event(kind="mouse", timestamp_ns=(1 + k) * 10**9, dx=d, dy=64)) for k, d in enumerate(dx)))[
        "input_ids"]])
    try:
        _exec("register", {})
        metric = OWAEventMetrics(tokenizer, alignment="generation")
        metric.update(ids(2, 10), ids(-3, 10))
        report = metric.compute()
    finally:
        unregister("dx_error")
    assert float(report["mouse/dx_abs_error_mean"]) == 2.5 and float(report["count/dx_events"]) == 2
    assert "mouse/dx_abs_error_mean" not in OWAEventMetrics(tokenizer, alignment="generation").compute()


def test_the_mlflow_block_logs_the_run_to_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow is in the 'dev' extra (mlflow-skinny)")
    readme = FENCE.findall((ROOT / "README.md").read_text())
    lightning = [code for code in readme if "trainer.fit(Agent(model), loader, loader)" in code]
    assert len(lightning) == 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")  # as on a machine without it: the block sets it
    namespace = {}
    exec(compile(lightning[0][:lightning[0].index("\ncallback = ")], "README.md (lightning block)", "exec"), namespace)
    _exec("mlflow", namespace)
    client, run = namespace["logger"].experiment, namespace["logger"].run_id
    logged = client.get_run(run).data.metrics
    assert logged["val/owa/comparable_rate"] == pytest.approx(float(
        namespace["trainer"].callback_metrics["val/owa/comparable_rate"]))
    files = [a.path for a in client.list_artifacts(run, "owa_metrics/val/owa")]
    assert len(files) == 4 and files[0].endswith(".json") and files[1].endswith(".md")
    assert files[2].endswith("_timeline_0.png") and files[3].endswith("_timeline_1.png")  # the epoch's timelines


def _python(code: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_the_first_compile_says_so_in_one_line_and_a_cached_run_does_not(tmp_path):
    """A fresh numba cache: two kernels compile, one line on stderr (the README quotes it); the next process loads
    them from the cache and prints nothing."""
    from owa_metrics.decode.kernel import COMPILING

    code = ("import numpy as np\nfrom owa_metrics.decode import kernel\nkernel.compiled_codes()\n"
            "kernel._codes(np.zeros(3, np.int64), np.zeros(4, np.int32), np.zeros(0, np.int64), np.zeros(3, np.int32))")
    first, second = _python(code, tmp_path), _python(code, tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert first.stderr.splitlines() == [COMPILING] and second.stderr == ""
    assert COMPILING.split(",")[0] in " ".join((ROOT / "README.md").read_text().split())


def test_token_sequences_without_image_tokens_says_how_to_add_them():
    """A text model's tokenizer given the event tokens alone (the README's recipe before): the error names the fix."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from owa_metrics import CodecConfig, VocabMap
    from owa_metrics.events import simulate_session
    from owa_metrics.tokens import token_sequences

    backend = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "<unk>": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>")
    tokenizer.add_tokens(sorted(CodecConfig.preset("factorized").event_tokens))
    with pytest.raises(ValueError, match=r"has no '<fake_token_around_image>'.*add_tokens\(list\(config\.extra_tokens"):
        token_sequences(VocabMap.from_tokenizer(tokenizer), simulate_session(3.0, format="factorized"), 256)
