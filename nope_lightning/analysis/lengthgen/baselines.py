"""The baselines beside NoPE, seed by seed: paper 001's RoPE and its extensions (zero-shot NTK and YaRN, PI and YaRN
fine-tuned) against NoPE, its uniform temperature and HeadScale, where a study's files run both (the RoPE rows
often come from files of their own, with fewer seeds than the NoPE rows).

- ``baselines_table``: Table 2's analog with each row's own seed count, the paper's value beside it;
- ``search_figure``: Fig 2 right, validation PPL against the uniform temperature lambda at each searched length,
  one line per search (a search on NoPE's model, one on RoPE's), thin per seed, thick the mean;
- ``passkey_figure``: Fig 6 as curves, passkey accuracy against prompt length per method, thin per seed.

A baseline is an evaluated method outside the NoPE family (``sources.Methods.nope_family``: the experiment
files' ``family: nope``); the NoPE rows beside them are the NoPE-family methods the files place beside a row of
the paper's Table 2. Nothing is drawn or tabled without both, so a NoPE-only study's report is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from nope_lightning.analysis.lengthgen import plots, tables
from nope_lightning.analysis.lengthgen.claims import Runs
from nope_lightning.analysis.markdown import markdown_table
from nope_lightning.analysis.report_frame import Plot, over_seeds
from nope_lightning.analysis.sources import Methods
from nope_lightning.results.evaluation import EvaluationResult
from nope_lightning.results.search import ScaleSearchResult


def compared(evals: Runs, methods: Methods) -> tuple[list[str], list[str]]:
    """``(baselines, NoPE rows)`` of ``evals`` (the module's rule), in the order read; both empty unless both
    exist."""
    baselines = [m for m in evals if m not in methods.nope_family]
    nope = [m for m in evals if m in methods.nope_family and m in methods.paper_rows("table2")]
    return (baselines, nope) if baselines and nope else ([], [])


def baselines_table(evals: Runs, methods: Methods) -> str:
    """Table 2 analog over the baselines and the NoPE rows beside them (``compared``) on the primary corpus: per row
    its seed count and its PPL at each length (mean log-PPL over the row's own seeds shown as PPL, [95 % t interval
    across them]; one seed: its run's bootstrap interval), and the paper's row where the file names one; a NoPE row
    evaluated on other corpora only (Table 2's second column) is left to that corpus's table. '' without baselines
    or NoPE rows."""
    baselines, nope = compared(evals, methods)
    if not baselines:
        return ""
    first = next(iter(evals[baselines[0]].values()))
    corpus = first.corpora[0]
    nope = [m for m in nope if any(corpus in (r.ppl or {}) for r in evals[m].values())]
    runs = {m: evals[m] for m in [*baselines, *nope]}
    lengths = sorted({n for by_seed in runs.values() for r in by_seed.values() for n in (r.ppl or {}).get(corpus, {})})
    header, rows = tables.ppl_rows(runs, corpus, lengths, methods.paper_rows("table2"), seeds=True)
    return (f"### Baselines beside NoPE (Table 2 analog on `{corpus}`, {first.split} split, stride {first.stride}; "
            f"each row over its own seeds: mean log-PPL shown as PPL, [95 % t interval across them; one seed: the "
            f"run's bootstrap interval]; {tables.paper_column_note(corpus)})\n\n" + markdown_table(header, rows)
            + f"\n\nBaselines: {', '.join(f'`{m}`' for m in baselines)}, {over_seeds({m: evals[m] for m in baselines})}"
            f"; NoPE rows: {', '.join(f'`{m}`' for m in nope)}, {over_seeds({m: evals[m] for m in nope})}.")


def _mean_line(per_seed: list[tuple[list[float], list[float]]], transform=np.asarray) -> tuple[list, list]:
    """The mean over seeds at the x every seed holds, in order (``transform`` of the mean y: e.g. exp of a mean
    log-PPL)."""
    shared = sorted(set.intersection(*(set(x) for x, _ in per_seed)))
    means = [np.mean([dict(zip(x, y, strict=True))[v] for x, y in per_seed]) for v in shared]
    return shared, list(transform(np.asarray(means, dtype=np.float64)))


def search_figure(searches: Mapping[str, Mapping[int | None, ScaleSearchResult]]) -> Plot | None:
    """Fig 2 right: each search's validation PPL against lambda, one panel per searched length (exp of each
    trial's log-PPL; the mean line is exp of the mean log-PPL over seeds); None unless two or more searches are
    read (one alone is its ``lambda_fit`` figures' and the search table's)."""
    if len(searches) < 2:
        return None
    first = next(r for by_seed in searches.values() for r in by_seed.values())
    lengths = sorted({n for by_seed in searches.values() for r in by_seed.values() for t in r.trials for n in t.logppl})
    panels = {}
    for n in lengths:
        lines = {}
        for method, by_seed in searches.items():
            per_seed = [([t.temperature for t in r.trials if n in t.logppl],
                         [float(np.exp(t.logppl[n])) for t in r.trials if n in t.logppl]) for r in by_seed.values()]
            per_seed = [line for line in per_seed if line[0]]
            if per_seed:
                logs = [(x, list(np.log(y))) for x, y in per_seed]
                lines[method] = (per_seed, _mean_line(logs, np.exp))
        panels[f"validation PPL at {n} tokens ({n / first.train_len:g}x)"] = lines
    drawn = {m: list(by_seed) for m, by_seed in searches.items()}
    return Plot(plots.seed_lines(panels, "lambda (units of 1/sqrt(d))", "validation PPL",
                                 "Uniform temperature: validation PPL against lambda (Fig 2 right)", vline=1.0,
                                 logy=True),
                f"Fig 2 right: validation PPL ({first.split} split) against the uniform temperature lambda of the "
                f"searches {', '.join(f'`{m}`' for m in searches)}, one panel per searched length; thin: one seed "
                f"each; thick: the mean log-PPL shown as PPL, {over_seeds(drawn)}; dashed: lambda 1 (no "
                "temperature).")


def _accuracy_by_length(result: EvaluationResult) -> tuple[list[int], list[float]]:
    lengths = sorted({s.length for s in result.passkey.samples})
    return lengths, [float(np.mean([s.correct for s in result.passkey.at(n)])) for n in lengths]


def passkey_figure(evals: Runs, methods: Methods) -> Plot | None:
    """Fig 6 as curves: passkey accuracy against prompt length, the NoPE rows (left) and the baselines with the
    reference beside them (right), thin per seed, thick the mean over seeds; None without baselines or passkeys."""
    baselines, nope = compared(evals, methods)
    groups = {"passkey: NoPE and its repairs": nope,
              "passkey: baselines": [*([methods.reference] if methods.reference in nope else []), *baselines]}
    panels, drawn = {}, {}
    for panel, members in groups.items():
        lines = {}
        for method in members:
            scored = {s: r for s, r in evals[method].items() if r.passkey is not None and r.passkey.samples}
            if scored:
                per_seed = [_accuracy_by_length(r) for r in scored.values()]
                lines[method], drawn[method] = (per_seed, _mean_line(per_seed)), list(scored)
        if lines:
            panels[panel] = lines
    if len(panels) < 2:
        return None
    train_len = next(iter(evals[baselines[0]].values())).train_len
    return Plot(plots.seed_lines(panels, "prompt length (tokens)", "passkey accuracy",
                                 "Passkey accuracy by prompt length (Fig 6)", vline=train_len, ranked_x=True),
                f"Fig 6 as curves: passkey accuracy against prompt length of {', '.join(f'`{m}`' for m in drawn)}; "
                f"thin: one seed each; thick: {over_seeds(drawn)}; the lengths evenly spaced; dashed: the training "
                f"length {train_len}.")


def baseline_sections(evals: Runs, searches: Mapping[str, Mapping[int | None, ScaleSearchResult]],
                      methods: Methods) -> tuple[str, dict[str, Plot | None]]:
    """The table and the figures (by file name) of one matrix point: '' and no figure where they have nothing to
    show."""
    figures = {"search_ppl_vs_lambda.png": search_figure(searches), "passkey_by_length.png": passkey_figure(evals, methods)}
    return baselines_table(evals, methods), {name: plot for name, plot in figures.items() if plot is not None}

