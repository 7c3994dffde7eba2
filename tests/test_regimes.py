"""experiments/regimes/regimes.py: the regime table reads a committed report's own tables (NoPE's PPL ratios, passkey, the
repair claim's estimate, the verdict counts), checked against the `small` report's numbers by hand."""

from __future__ import annotations

import sys

from tests.conftest import REPO, load_script


def test_a_row_is_read_from_the_report_s_tables(tmp_path, monkeypatch):
    regimes = load_script("experiments/regimes/regimes.py")
    del sys.modules["regimes"]  # the reference is enough from here on
    report = REPO / "experiments/small/results/report.md"
    row = regimes.row("gentle", report)
    # small report: NoPE 29.9 / 39.3 / 50.1 at 1x / 2x / 4x, passkey 0.62 at 128, repair +0.161 of the gap,
    # claims: 5 reproduced, 6 not reproduced, 2 untestable.
    assert row == ["gentle", "`small`", "29.9", f"{39.3 / 29.9:.2f}", f"{50.1 / 29.9:.2f}", "0.62 at 128",
                   "+0.161 [+0.144, +0.180]", "6 not reproduced, 5 reproduced, 2 untestable"]
    monkeypatch.setattr(sys, "argv", ["regimes.py", str(tmp_path), f"gentle={report}"])
    regimes.main()
    text = (tmp_path / "report.md").read_text()
    assert "| gentle | `small` | 29.9 | 1.31 | 1.68 | 0.62 at 128 |" in text
