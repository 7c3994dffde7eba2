"""The report's markdown tables, each number with its 95 % interval and its seed count.

Input: ``method -> seed -> results`` of one matrix point (``claims.Runs``). With two or more seeds a cell is
the mean over seeds with a Student t interval across seeds (training variance: another seed is another
model); with one seed it is that run's own interval (a bootstrap over blocks of evaluation windows for
perplexity, Wilson for passkey accuracy). Perplexities are averaged as log-PPL and shown as PPL. What was not
run prints "—". Method-against-method differences are paired instead (``paired_table``, ``claims_table``): a
bootstrap over the shared windows and prompts, pooled over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nope_lightning import paper
from nope_lightning.claims import NotMeasured, Outcome, Runs, measure
from nope_lightning.paper import Claim
from nope_lightning.stats import UNIT, Interval, t_interval, wilson

MISSING = "—"


#: Marks an interval that does not contain its own estimate (``Interval.covers_estimate``).
BIASED = "†"
BIASED_NOTE = (f"{BIASED} The estimate lies outside its bootstrap interval: resampling biases this statistic (a "
               "non-smooth one, such as an R^2 of per-position best-lambda fits), so the interval shows the spread, "
               "not where the value lies; verdicts use the interval widened to include the estimate.")


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A markdown table; a footnote follows it when a cell carries the ``BIASED`` mark."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if any(BIASED in str(c) for row in rows for c in row):
        lines += ["", BIASED_NOTE]
    return "\n".join(lines)


def seed_note(runs: Runs) -> str:
    """'3 seeds: mean and 95 % t interval across seeds' or the one-seed equivalent."""
    seeds = max((len(by_seed) for by_seed in runs.values()), default=0)
    if seeds > 1:
        return f"{seeds} seeds: mean over seeds, [95 % t interval across seeds]"
    return "1 seed: [95 % interval of the run: bootstrap over blocks of windows, Wilson for passkey]"


def cell(interval: Interval | None, show: Callable[[float], str] = "{:.2f}".format) -> str:
    """'estimate [low, high]', marked ``BIASED`` when the interval misses its estimate; '—' when missing."""
    if interval is None or math.isnan(interval.estimate):
        return MISSING
    if math.isnan(interval.low) or math.isnan(interval.high):
        return show(interval.estimate)
    mark = "" if interval.covers_estimate else BIASED
    return f"{show(interval.estimate)} [{show(interval.low)}, {show(interval.high)}]{mark}"


def across(by_seed: dict, value: Callable[[dict], float | None], single: Callable[[dict], Interval | None],
           bounds: tuple[float, float] = (-math.inf, math.inf)) -> Interval | None:
    """``value`` per seed -> mean and t interval across seeds (clipped to ``bounds``); one seed -> ``single``
    (the run's interval)."""
    values = [v for r in by_seed.values() if (v := value(r)) is not None]
    if not values:
        return None
    if len(by_seed) == 1:
        return single(next(iter(by_seed.values())))
    return t_interval(values, bounds=bounds)


def exp_interval(interval: Interval | None) -> Interval | None:
    return None if interval is None else Interval(*(math.exp(v) for v in (interval.estimate, interval.low,
                                                                            interval.high)))


def _ppl_at(result: dict, corpus: str, n: int) -> dict | None:
    return result.get("ppl", {}).get(corpus, {}).get(str(n))


def log_ppl(by_seed: dict, corpus: str, n: int) -> Interval | None:
    """Mean log-PPL at ``n`` tokens over seeds (t interval) or the run's bootstrap interval."""
    def value(r: dict) -> float | None:
        p = _ppl_at(r, corpus, n)
        return None if p is None else p["nll"]

    def single(r: dict) -> Interval | None:
        p = _ppl_at(r, corpus, n)
        return None if p is None else Interval(p["nll"], p["nll_low"], p["nll_high"])

    return across(by_seed, value, single)


def ppl_tables(runs: Runs) -> str:
    """Table 2 analog: PPL per method x length for each corpus, with the paper's row where it has one."""
    first = next(iter(next(iter(runs.values())).values()))
    train_len, out = first["train_len"], []
    for corpus in first["corpora"]:
        lengths = sorted({int(n) for by_seed in runs.values() for r in by_seed.values()
                          for n in r.get("ppl", {}).get(corpus, {})})
        if not lengths:
            continue
        reference = paper.TABLE2_PROOFPILE if corpus in ("math", "code") else paper.TABLE2_PG19
        header = ["method", *[f"{n} ({n / train_len:g}x)" for n in lengths], "paper 1x/2x/4x/8x"]
        rows = []
        for method, by_seed in runs.items():
            cells = [cell(exp_interval(log_ppl(by_seed, corpus, n)), paper.fmt) for n in lengths]
            ref = reference.get(method)
            rows.append([method, *cells, " / ".join(paper.fmt(v) for v in ref) if ref else MISSING])
        name = "PG19" if reference is paper.TABLE2_PG19 else "Proof-pile"
        out.append(f"### Sliding-window perplexity on `{corpus}` ({first['split']} split, stride {first['stride']}, "
                   f"every length scored on the same target tokens; {seed_note(runs)}; paper column: {name}, "
                   f"TinyLlama-1.1B at 2K)\n\n" + markdown_table(header, rows))
    return "\n\n".join(out)


def paired_table(runs: Runs, resamples: int, reference: str = "nope") -> str:
    """Every method against ``reference`` on the same windows and prompts: per seed the paired difference
    (log-PPL at each evaluation length, passkey accuracy at each passkey length), pooled as the mean over seeds
    with its 95 % bootstrap interval (``claims.measure``), and on how many seeds the method does better (lower
    log-PPL, higher accuracy). Across-seed t intervals of each method's own figures (the tables above) are
    unpaired; these differences cancel the seed's model and the text, which is what a comparison needs."""
    if reference not in runs:
        return ""
    first = next(iter(runs[reference].values()))
    L = first["train_len"]
    columns = [("log_ppl_difference", (n // L, n // L), f"Δ log-PPL {n // L:g}x", -1)
               for n in first.get("lengths", []) if n % L == 0]
    columns += [("passkey_difference", (m,), f"Δ passkey {m:g}x", 1)
                for m in sorted({s[0] // L for s in first.get("passkey", {}).get("samples", [])})]
    rows = []
    for method in runs:
        if method == reference:
            continue
        cells = []
        for test, multiples, _, better in columns:
            try:
                interval, _ = measure(test, Claim(method, "", "", test, (method, reference), multiples), runs,
                                      resamples)
            except NotMeasured:
                cells.append(MISSING)
                continue
            wins = sum(better * e > 0 for e in interval.per_seed)
            cells.append(f"{cell(interval, '{:+.3f}'.format)} ({wins}/{len(interval.per_seed)})")
        if any(c != MISSING for c in cells):
            rows.append([method, *cells])
    if not rows:
        return ""
    return (f"### Paired against `{reference}` (same windows, same prompts; mean of per-seed differences, [95 % "
            f"bootstrap interval], (seeds where the method does better: lower log-PPL, higher passkey accuracy))"
            f"\n\n" + markdown_table(["method", *[label for _, _, label, _ in columns]], rows))


def octave_interval(by_seed: dict, index: int) -> Interval | None:
    """Mean log-PPL over the ``index``-th octave of positions ([0, L), [L, 2L), ...)."""
    def value(r: dict) -> float | None:
        curve = next(iter(r["position"]["octave_logppl"].values())) if "position" in r else None
        return None if curve is None or index >= len(curve["mean"]) else curve["mean"][index]

    def single(r: dict) -> Interval | None:
        curve = next(iter(r["position"]["octave_logppl"].values())) if "position" in r else None
        if curve is None or index >= len(curve["mean"]):
            return None
        return Interval(curve["mean"][index], curve["low"][index], curve["high"][index])

    return across(by_seed, value, single)


def bucket_table(runs: Runs) -> str:
    """Per-position PPL over [0, L), [L, 2L), [2L, 4L), ... of the longest windows."""
    with_position = {m: s for m, s in runs.items() if any("position" in r for r in s.values())}
    if not with_position:
        return ""
    first = next(r for s in with_position.values() for r in s.values() if "position" in r)
    ranges = [tuple(o) for o in first["position"]["octaves"]]
    L = first["train_len"]
    header = ["method", *[f"[{_times_l(a, L)}, {_times_l(b, L)})" for a, b in ranges],
              f"[{_times_l(ranges[-1][0], L)}, {_times_l(ranges[-1][1], L)}) / [0, L)"]
    rows = []
    for method, by_seed in with_position.items():
        cells = [cell(exp_interval(octave_interval(by_seed, i)), paper.fmt) for i in range(len(ranges))]
        ratios = [v for r in by_seed.values() if (v := _octave_ratio(r, len(ranges) - 1)) is not None]
        rows.append([method, *cells, cell(exp_interval(t_interval(ratios))) if ratios else MISSING])
    windows = len(first["position"]["octave_logppl"][first["corpora"][0]]["windows"])
    return (f"### Per-position perplexity by range ({first['split']} split, {windows} non-overlapping windows of "
            f"{ranges[-1][1]} tokens; {seed_note(with_position)})\n\n" + markdown_table(header, rows))


def _times_l(position: int, train_len: int) -> str:
    """0, L, 2L, 2.5L ... for a position."""
    multiple = position / train_len
    return "0" if not position else "L" if multiple == 1 else f"{multiple:g}L"


def _octave_ratio(result: dict, index: int) -> float | None:
    curve = next(iter(result["position"]["octave_logppl"].values())) if "position" in result else None
    return None if curve is None else curve["mean"][index] - curve["mean"][0]


def passkey_interval(by_seed: dict, n: int | None) -> Interval | None:
    """Accuracy at ``n`` tokens (None: over every length): mean over seeds with a t interval, or one run's
    Wilson interval."""
    def value(r: dict) -> float | None:
        samples = [s[3] for s in r.get("passkey", {}).get("samples", []) if n is None or s[0] == n]
        return float(np.mean(samples)) if samples else None

    def single(r: dict) -> Interval | None:
        samples = [s[3] for s in r.get("passkey", {}).get("samples", []) if n is None or s[0] == n]
        return wilson(sum(samples), len(samples)) if samples else None

    return across(by_seed, value, single, UNIT)


def passkey_table(runs: Runs) -> str:
    with_keys = {m: s for m, s in runs.items() if any("passkey" in r for r in s.values())}
    if not with_keys:
        return ""
    first = next(r for s in with_keys.values() for r in s.values() if "passkey" in r)
    lengths = sorted({int(sample[0]) for s in with_keys.values() for r in s.values() if "passkey" in r
                      for sample in r["passkey"]["samples"]})
    rows = [[m, *[cell(passkey_interval(s, n)) for n in lengths], cell(passkey_interval(s, None))]
            for m, s in with_keys.items()]
    depths = len({sample[1] for sample in first["passkey"]["samples"]})
    keys = len(first["passkey"]["samples"]) // max(1, depths * len(lengths))
    return (f"### Passkey retrieval accuracy ({first['passkey']['prompt']} prompt, {depths} depths x {keys} "
            f"key{'s' if keys > 1 else ''} per length, greedy; {seed_note(with_keys)})\n\n"
            + markdown_table(["method", *map(str, lengths), "all lengths"], rows))


def longctx_table(runs: Runs) -> str:
    tasks = sorted({t for s in runs.values() for r in s.values() for t in r.get("longctx", {})})
    if not tasks:
        return ""
    rows = []
    for method, by_seed in runs.items():
        cells = []
        for task in tasks:
            values = [float(np.mean(list(r["longctx"][task].values()))) for r in by_seed.values()
                      if task in r.get("longctx", {})]
            cells.append(cell(t_interval(values, bounds=UNIT)) if values else MISSING)
        rows.append([method, *cells])
    return ("### Offline long-context tasks (mean score over lengths, 0-1)\n\n"
            + markdown_table(["method", *tasks], rows))


def ablation_table(runs: Runs, outcomes: Sequence[Outcome]) -> str:
    """Table 4 analog over the HeadScale variants: PPL at the longest length, passkey over all lengths,
    long-context mean ("—" where not run), the paper's figures, and the degenerate-ablation notes the claims
    found."""
    rows = []
    for method, by_seed in runs.items():
        if not method.startswith("headscale"):
            continue
        first = next(iter(by_seed.values()))
        longest = max(first.get("lengths") or [0])
        ppl = exp_interval(log_ppl(by_seed, first["corpora"][0], longest)) if longest else None
        longctx = [float(np.mean([np.mean(list(v.values())) for v in r["longctx"].values()]))
                   for r in by_seed.values() if r.get("longctx")]
        key = ("headscale w/o constraint" if "constraint" in method else "headscale w/o init" if "init" in method
               else "headscale")
        ref = paper.TABLE4[key]
        rows.append([method, cell(ppl, paper.fmt), cell(passkey_interval(by_seed, None)),
                     cell(t_interval(longctx, bounds=UNIT)) if longctx else MISSING,
                     f"{ref['pg19']} / {ref['passkey']}% / {ref['longbench']}"])
    if not rows:
        return ""
    notes = [o.reason for o in outcomes if o.verdict == "untestable" and "degenerate" in o.reason]
    return ("### HeadScale ablations (Table 4 analog)\n\n"
            + markdown_table(["method", "PPL @ longest", "passkey (all lengths)", "long-context",
                              "paper PPL@16K / passkey / LongBench"], rows)
            + "".join(f"\n\nNote: {n}." for n in notes))


def search_section(method: str, by_seed: dict) -> str:
    """Per seed: the best lambda per target with its bootstrap interval, edge flags, and the fit."""
    rows = []
    for seed, summary in by_seed.items():
        intervals = summary.get("intervals", {})
        best = ", ".join(f"{n}: {lam:g}" + (f" [{intervals['best'][n][0]:g}, {intervals['best'][n][1]:g}]"
                                            if n in intervals.get("best", {}) else "")
                         + (" (grid edge)" if summary.get("best_on_grid_edge", {}).get(n) else "")
                         for n, lam in summary["best"].items())
        fit, fit_iv = summary["fit"], intervals.get("fit", {})
        a, r2 = (cell(Interval(fit[k], *fit_iv.get(k, (math.nan, math.nan))), f"{{:.{digits}f}}".format)
                 for k, digits in (("a", 3), ("r2", 2)))
        rows.append([MISSING if seed is None else seed, best, a, r2])
    first = next(iter(by_seed.values()))
    return (f"### Uniform-scale search ({method}; chosen on the {first.get('split', 'val')} split, grid "
            f"{first.get('grid')}, 95 % bootstrap intervals over validation windows)\n\n"
            + markdown_table(["seed", "best lambda per target (units of 1/sqrt(d))", "fit a of 1 + a ln s",
                              "R^2"], rows)
            + "\n\nPaper: a = 0.301, R^2 = 0.995 at 10K steps; a = 0.397, R^2 = 0.977 at 50K steps.")


RECIPE_KEYS = ("model.pos_encoding", "model.ssmax", "model.n_layer", "model.n_embd", "data.corpus", "train_len",
               "batch_size", "trainer.devices", "trainer.max_steps", "tokens_per_parameter", "optim.lr",
               "optim.min_lr_ratio", "retrieval.fraction", "retrieval.length", "seed")


def recipe_section(pretrains: list) -> str:
    """Which pre-training recipe produced the models: every figure above depends on it."""
    if not pretrains:
        return ""
    def param(run, key: str) -> str:  # MLflow logs an unset (None) setting as the string "None"
        value = run.data.params.get(key, "None")
        return MISSING if value == "None" else value

    rows = [[run.info.run_name, *[param(run, k) for k in RECIPE_KEYS]] for run in pretrains]
    return ("### Pre-training recipe of the models above\n\n" + markdown_table(["run", *RECIPE_KEYS], rows)
            + "\n\nA retrieval fraction above 0 means passkey sequences were mixed into pre-training (off in "
              "the paper's recipe): passkey figures of such models measure a skill the model was taught inside "
              "L, and how far past L it survives.")


def claims_table(outcomes: Sequence[Outcome]) -> str:
    """Each claim: its rule, paper 001's figure, our pooled effect with its interval and per-seed estimates,
    how many seeds lie on the claim's side, and the verdict (``claims.verdict``)."""
    rows = []
    for o in outcomes:
        if o.interval is None:
            ours, side = f"{o.verdict}: {o.reason}", MISSING
        else:
            show = ("{:+.3f}" if o.claim.signed else "{:.3f}").format
            per_seed = " / ".join(map(show, o.interval.per_seed))
            ours = f"{cell(o.interval, show)} {o.claim.unit}"
            ours += f" (per seed: {per_seed})" if len(o.interval.per_seed) > 1 else ""
            side = f"{o.on_side} of {len(o.interval.per_seed)}"
        rows.append([o.claim.text, o.claim.rule, o.claim.paper, ours, side, f"**{o.verdict}**"])
    return ("### Paper 001's claims, tested\n\n"
            "Each effect is paired (the compared methods scored on the same windows or prompts) and pooled over "
            "seeds (the mean of per-seed effects; 95 % bootstrap interval). *reproduced*: the interval clears the "
            "threshold and every seed's estimate is on the claim's side; *not reproduced*: the interval excludes "
            "the effect; *inconclusive*: neither; *untestable*: a precondition fails.\n\n"
            + markdown_table(["claim", "rule", "paper 001", "ours", "seeds on the claim's side", "verdict"], rows))
