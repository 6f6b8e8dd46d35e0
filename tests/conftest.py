from pathlib import Path

import pytest

from owa_metrics import CodecConfig, EventCodec, VocabMap, build_tokenizer

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
RECORDINGS = ["example.mcap", "0.4.2.mcap", "0.5.1.mcap"]


def recording_paths():
    if not all((SHARED_DATA / name).exists() for name in RECORDINGS):
        pytest.skip(f"the real recordings are not at {SHARED_DATA} (../shared/data beside the checkout)")
    pytest.importorskip("mcap_owa", reason="reading recordings needs the 'owa' extra (mcap-owa-support)")
    return [SHARED_DATA / name for name in RECORDINGS]


@pytest.fixture(scope="session")
def codec():
    return EventCodec(CodecConfig())


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def vocab(tokenizer):
    return VocabMap.from_tokenizer(tokenizer)


@pytest.fixture(scope="session", params=["hierarchical", "factorized"])
def format_vocab(request):
    """The offline tokenizer's map in each format (SmolVLM image tokens)."""
    return VocabMap.from_tokenizer(build_tokenizer(format=request.param))


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """One run of ``owa-metrics demo`` with its defaults (the README's first command), shared by the tests that read
    it: ``(printed text, log dir)``."""
    import contextlib
    import io

    from owa_metrics.cli import main

    out, printed = tmp_path_factory.mktemp("demo"), io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["demo", "--out", str(out)]) == 0
    return printed.getvalue(), out / "tensorboard" / "version_0"


@pytest.fixture(scope="session")
def d2e_pairs(tmp_path_factory):
    """The real recordings as D2E MCAPs (absolute mouse -> ``mouse/raw`` by differences; tests/d2e_oracle.py), paired
    (truth, prediction): a recording with its perturbed prediction on another clock (1970 vs 2025), and two
    different recordings both ways (video times from pts 0 and 3 s)."""
    from d2e_oracle import convert_recording, perturb

    paths = dict(zip(("example", "0.4.2", "0.5.1"), recording_paths()))
    out = tmp_path_factory.mktemp("d2e")
    example = convert_recording(paths["example"], out / "example.mcap")
    guess = perturb(paths["example"], out / "example_pred.mcap", seed=1, clock_ns=-1_750_000_000_000_000_000,
                    pts0_ns=20_000_000)
    old = convert_recording(paths["0.4.2"], out / "0.4.2.mcap", pts0_ns=3_000_000_000)
    new = convert_recording(paths["0.5.1"], out / "0.5.1.mcap", clock_ns=123_456_789, pts0_ns=2_000_000_000)
    return [(example, guess), (old, new), (new, example)]
