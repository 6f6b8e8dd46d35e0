"""Issue 46 item 6: the D2E paper's G-IDM figures beside the user's keys. The oracle is docs/METRICS.md's table
(transcribed from the paper's Tables 4, 5 and 18): the code's table equals it, and `owa-metrics evaluate --bin-ms 50`
prints it beside the user's values."""

from decimal import Decimal
from pathlib import Path

from owa_metrics.functional import d2e_paper
from d2e_oracle import oracle
from test_d2e import _cli, _synthetic

METRICS_MD = Path(__file__).resolve().parents[1] / "docs" / "METRICS.md"
COLUMNS = ("pearson_x", "pearson_y", "scale_ratio_x", "scale_ratio_y", "key_accuracy", "button_accuracy")


def _table(lines: list[str], header: str) -> list[list[str]]:
    """The cells of the markdown table under the line starting with ``header`` (its separator skipped)."""
    at = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _doc_rows() -> list[list[str]]:
    rows = _table(METRICS_MD.read_text().splitlines(), "| game | `pearson_x`")
    assert [r[0] for r in rows] == ["Brotato", "Stardew Valley", "Core Keeper", "Apex Legends", "GTA V", "Minecraft",
                                    "mean of the 6 games"]
    return rows


def test_the_code_table_equals_the_doc_table_and_each_mean_its_rows():
    rows = _doc_rows()
    assert d2e_paper.KEYS == ("mouse_move/pearson_x", "mouse_move/pearson_y", "mouse_move/scale_ratio_x",
                              "mouse_move/scale_ratio_y", "keyboard/key_accuracy", "mouse_button/button_accuracy")
    assert [(r[0], *map(float, r[1:])) for r in rows] == [*d2e_paper.PER_GAME, d2e_paper.MEAN]
    games, mean = rows[:-1], rows[-1]
    for c in range(1, 7):  # the mean of the rounded rows, within half a unit of the mean's and of the rows' digits
        got = sum(Decimal(r[c]) for r in games) / len(games)
        half = lambda text: Decimal(1).scaleb(Decimal(text).as_tuple().exponent) / 2  # noqa: E731
        assert abs(got - Decimal(mean[c])) <= half(mean[c]) + max(half(r[c]) for r in games), (COLUMNS[c - 1], got)


def test_cli_prints_the_paper_beside_the_user_at_its_protocol_only(tmp_path):
    truth, pred = _synthetic(tmp_path, "mixed")
    doc, want = _doc_rows(), {f"d2e/{k}": v for k, v in oracle(truth, pred, 50).items()}
    code, out, err = _cli(["--pred", pred, "--target", truth, "--bin-ms", 50])
    assert code == 0, err
    lines = out.splitlines()
    printed = _table(lines, "| key | value | D2E paper, G-IDM")
    assert sorted(r[0] for r in printed) == sorted(want)  # every key of the protocol
    paper = {f"d2e/mouse_move/{c}": i for i, c in enumerate(COLUMNS[:4], 1)} | {
        "d2e/keyboard/key_accuracy": 5, "d2e/mouse_button/button_accuracy": 6}
    assert paper.keys() <= want.keys()  # the pair has every key the paper reports
    for key, value, reference in printed:
        assert abs(float(value) - want[key]) <= 1e-5 * max(1.0, abs(want[key])), key
        assert (float(reference) == float(doc[-1][paper[key]])) if key in paper else reference == "", key
    per_game = _table(lines, "| game | pearson_x | pearson_y | scale_ratio_x | scale_ratio_y | key_accuracy | "
                             "button_accuracy |")
    assert [(r[0], *map(float, r[1:])) for r in per_game] == [(r[0], *map(float, r[1:])) for r in doc]
    assert any(line.startswith("Source: D2E") and "2510.05684" in line and "Table 18" in line for line in lines)

    for other in (["--bin-ms", 20], ["--bin-ms", 50, "--empty-bins-as-correct"]):  # not the paper's protocol
        code, out, err = _cli(["--pred", pred, "--target", truth, *other])
        assert code == 0, err
        lines = out.splitlines()
        assert "| key | value |" in lines and "D2E paper, G-IDM" not in out and "| game |" not in out
        assert any("are at 50 ms bins without empty bins" in line for line in lines)
