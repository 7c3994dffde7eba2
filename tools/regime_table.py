"""The regime search's table (experiments/regime/README.md), from the runs it measured.

    python tools/regime_table.py [experiments/regime/results/runs.json]

``runs.json`` holds, for every point of ``experiments/regime/regime.yaml`` that was run, the pre-training run (seconds,
non-embedding parameters, tokens), the test evaluation (PPL at 1x-8x on the same target tokens, passkey with the
answer inside L at 122 + 6 tokens and past it), the uniform-lambda search at 2x / 4x (validation) and the test PPL
at the best 2x lambda. One row per (point, seed); a point with several seeds gets a pooled row: the geometric
mean of each PPL ratio with its 95 % t interval across seeds (df = seeds - 1, on the log ratio) and the mean
passkey with the smallest seed's value. Ratios are PPL(kL) / PPL(L); "gap closed" is the share of the 1x -> 2x
PPL gap that the best 2x lambda closes on test.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from nope_lightning.numerics.stats import t_interval

STEP = re.compile(r"(\w+)\[(.*)\]$")


def points(runs: list[dict]) -> dict[tuple, dict[str, dict]]:
    """``(pe, n_layer, n_embd, tokens_per_parameter, retrieval_fraction) -> seed -> measures``."""
    table: dict[tuple, dict[str, dict]] = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        step, where = STEP.match(run["step"]).groups()
        at = dict(part.split("=") for part in where.split(","))
        key = (at.get("pos_encoding", "nope"), int(at["n_layer"]), int(at.get("n_embd", 64)),
               int(at["tokens_per_parameter"]), at["retrieval_fraction"])
        row, m = table[key][at["seed"]], run["metrics"]
        if step == "pretrain_nope":
            row.update(tokens=m["train/tokens"], seconds=run["seconds"])
        elif step == "eval_nope":
            ppl = {n: m[f"test/len{n}/ppl"] for n in (128, 256, 512, 1024)}
            row.update(ppl=ppl, passkey=[m[f"passkey/len{n}/acc"] for n in (122, 250, 506)])
        elif step == "search_nope":
            row.update(lam=[m[f"scale_search/len{n}/best_lambda"] for n in (256, 512)])
        elif step == "eval_nope_best_2x":
            row.update(best_2x=m["test/len256/ppl"])
    return table


def ratios(row: dict) -> list[float]:
    return [row["ppl"][n] / row["ppl"][128] for n in (256, 512, 1024)]


def gap_closed(row: dict) -> float:
    ppl = row["ppl"]
    return (ppl[256] - row["best_2x"]) / (ppl[256] - ppl[128]) if "best_2x" in row else math.nan


def seed_row(key: tuple, seed: str, row: dict) -> str:
    pe, depth, width, tpp, _ = key
    r = ratios(row)
    keys = " / ".join(f"{p:.2f}" for p in row["passkey"])
    lam = " / ".join(f"{x:.1f}" for x in row.get("lam", [math.nan] * 2))
    return (f"| {pe} | {depth} x {width} | {tpp} | {seed} | {row['tokens'] / 1e6:.1f} | {row['ppl'][128]:.1f} | "
            f"{r[0]:.2f} | {r[1]:.2f} | {r[2]:.1f} | {keys} | {lam} | {gap_closed(row):.2f} |")


def pooled_row(key: tuple, rows: list[dict]) -> str:
    pe, depth, width, tpp, _ = key
    cells = []
    for index in range(3):
        logs = t_interval([math.log(ratios(row)[index]) for row in rows])
        cells.append(f"{math.exp(logs.estimate):.2f} [{math.exp(logs.low):.2f}, {math.exp(logs.high):.2f}]")
    inside = [row["passkey"][0] for row in rows]
    closed = sum(gap_closed(row) for row in rows) / len(rows)
    return (f"| **{pe}** | **{depth} x {width}** | **{tpp}** | **{len(rows)} seeds** | | "
            f"{sum(row['ppl'][128] for row in rows) / len(rows):.1f} | {cells[0]} | {cells[1]} | {cells[2]} | "
            f"1x mean {sum(inside) / len(inside):.2f}, min {min(inside):.2f} | | {closed:.2f} |")


def table(runs: list[dict]) -> str:
    lines = ["| PE | depth x width | tokens / parameter | seed | train tokens (M) | PPL(L) | PPL(2L) / PPL(L) | "
             "PPL(4L) / PPL(L) | PPL(8L) / PPL(L) | passkey 1x / 2x / 4x | best lambda 2x / 4x | 2x gap closed |",
             "|" + "---|" * 12]
    for key, seeds in sorted(points(runs).items()):
        done = {seed: row for seed, row in sorted(seeds.items()) if "ppl" in row}
        lines += [seed_row(key, seed, row) for seed, row in done.items()]
        if len(done) > 1:
            lines.append(pooled_row(key, list(done.values())))
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results/regime/runs.json")
    print(f"# Regime search (`experiments/regime/regime.yaml`): NoPE's failure past L against depth, width and budget\n\n"
          f"Made by `python tools/regime_table.py` from `{path.name}` (the measured runs).\n\n"
          + table(json.loads(path.read_text())))
