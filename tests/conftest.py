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
