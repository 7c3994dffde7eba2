"""Paper 001's study in two regimes side by side (experiments/regimes/README.md), from their committed reports.

    python experiments/regimes/regimes.py OUT_DIR LABEL=REPORT [LABEL=REPORT ...]
    python experiments/regimes/regimes.py experiments/regimes/results \\
        "gentle: small (4 x 128, 5.6 M tokens)=experiments/small/results/report.md" \\
        "sharp: regime_study (12 x 64, 12.1 M tokens)=experiments/regime_study/results/report.md"

One row per report: NoPE's test PPL at L and its ratios PPL(2L) / PPL(L) and PPL(4L) / PPL(L) (ratios of the
seed-mean PPLs in the report's perplexity table), NoPE's passkey accuracy at the report's shortest prompt, the
share of NoPE's 1x -> 2x gap that the best uniform lambda at 2x closes (the "repairs 2x" claim's estimate) and the
count of each verdict in the report's claims table. Everything is read from the reports themselves (the committed
record; the older `small` report predates results bundles), so a row names the run that made it.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """``{section title: rows as {header: cell}}`` for every markdown table under a ``###`` title of ``text``."""
    out: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=### )", text):
        title, _, body = block.partition("\n")
        lines = [line for line in body.splitlines() if line.startswith("|")]
        if len(lines) < 3:
            continue
        split = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        out[title.removeprefix("### ")] = [dict(zip(split[0], row, strict=True)) for row in split[2:]]
    return out


def section(found: dict[str, list[dict[str, str]]], prefix: str) -> list[dict[str, str]]:
    return next((rows for title, rows in found.items() if title.startswith(prefix)), [])


def first_number(cell: str) -> float:
    return float(NUMBER.search(cell).group())


def row(label: str, report: Path) -> list[str]:
    found = tables(report.read_text())
    ppl = next(r for r in section(found, "Sliding-window perplexity") if r["method"] == "nope")
    by_multiple = {float(m.group(1)): first_number(v) for k, v in ppl.items() if (m := re.search(r"\((\d+)x\)", k))}
    passkey = next((r for r in section(found, "Passkey retrieval accuracy") if r["method"] == "nope"), {})
    shortest = next((k for k in passkey if k != "method"), None)
    claims = section(found, "Paper 001's claims") or section(found, "The claims, tested")
    repair = next((r for r in claims if r["claim"].startswith("a uniform temperature repairs 2x")), None)
    closed = "—"
    if repair is not None:
        ours = next(v for k, v in repair.items() if k.startswith("ours"))
        closed = ours.split(" of the gap")[0] if "of the gap" in ours else ours
    # "1 seed: no verdict about seeds" (a method only one seed ran) counts as "no verdict (1 seed)"
    verdicts = Counter(r["verdict"].strip("*").replace("1 seed: no verdict about seeds", "no verdict (1 seed)")
                       for r in claims)
    return [label, f"`{report.parents[1].name}`", f"{by_multiple[1]:.1f}", f"{by_multiple[2] / by_multiple[1]:.2f}",
            f"{by_multiple[4] / by_multiple[1]:.2f}",
            f"{first_number(passkey[shortest]):.2f} at {shortest.split(' (')[0]}" if shortest else "—", closed,
            ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "—"]


def main() -> None:
    out, pairs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    header = ["regime", "report", "NoPE PPL(L)", "PPL(2L) / PPL(L)", "PPL(4L) / PPL(L)", "NoPE passkey (shortest)",
              "best lambda@2x closes of the 2x gap", "verdicts"]
    rows = [row(label, Path(path)) for label, path in pairs]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("# Paper 001 in two regimes\n\nMade by `python experiments/regimes/regimes.py` from "
                                   + ", ".join(f"`{p}`" for _, p in pairs) + ".\n\n" + "\n".join(lines) + "\n")
    print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
