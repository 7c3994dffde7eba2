"""``report``: markdown tables and PNG plots from the runs of a pipeline, with the papers' numbers beside ours.

Reads its sources (``analysis/sources.py``: pipeline runs in MLflow stores, results bundles earlier reports
wrote) and files their results in one index by stage, matrix point, method and seed (``results/index.py``,
keyed by each run's ``RunKey``). It tests the pipeline's claims (``analysis/claims.py``), writes the tables
(``analysis/tables.py``) or, for a sweep, the sweep section (``analysis/sweep.py``), the figures with their
bands, ``report.md``, a self-contained ``report.html`` and the results it read (``results/``, a bundle:
``results/bundle.py``) under ``out_dir``, and logs them, with per-method headline metrics, to the pipeline run
itself (artifact folder ``report/``; a rerun overwrites them, so there is one report per pipeline run). What it
knows of each method (the paper row it sits beside, its family, the paired table's reference) is the experiment
file's (``tables.Methods``), never read from the method's label.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nope_lightning.analysis import (
    attention_claims,
    claims,
    markdown,
    plots,
    report_sections,
    sweep,
    synthetic_claims,
    synthetic_figures,
    synthetic_learned,
    synthetic_tables,
    tables,
)
from nope_lightning.analysis import sources as report_sources
from nope_lightning.config.paper import CLAIMS_BY_ID
from nope_lightning.config.pipeline import ReportConfig
from nope_lightning.numerics.stats import t_interval
from nope_lightning.results.bundle import Bundle
from nope_lightning.results.evaluation import Curve, EvaluationResult
from nope_lightning.runtime import tracking


def point_sections(evals: dict, searches: dict, outcomes: list, resamples: int,
                   methods: tables.Methods) -> tuple[list[str], dict[str, Any]]:
    """The tables and figures of one matrix point."""
    sections = [report_sections.retrieval_line(claims.retrieval_by_seed(evals)) if outcomes else "",
                report_sections.claims_table(outcomes) if outcomes else "",
                tables.ppl_tables(evals, methods.paper_rows("table2")) if evals else "", tables.bucket_table(evals),
                tables.ablation_table(evals, outcomes, methods.paper_rows("table4")), tables.passkey_table(evals),
                report_sections.retrieval_table(evals), tables.key_nll_table(evals), tables.longctx_table(evals),
                *(tables.paired_table(evals, resamples, reference) for reference in methods.references),
                *(report_sections.search_section(method, by_seed) for method, by_seed in searches.items())]
    figures: dict[str, Any] = {}
    for by_seed in searches.values():
        for seed, summary in by_seed.items():
            name = f"lambda_fit{'' if seed is None else f'_s{seed}'}.png"
            figures[name] = plots.lambda_fit(summary)
    if evals:
        # Fig 1/4: the NoPE family (plain, uniform lambda, HeadScale), then the baselines beside the reference.
        nope_family = {m: s for m, s in evals.items() if m in methods.nope_family}
        baselines = {m: s for m, s in evals.items() if m not in nope_family or m == methods.reference}
        figures["position_curves_nope.png"] = position_figure(nope_family)
        figures["position_curves_baselines.png"] = position_figure(baselines)
        figures["passkey_heatmaps.png"] = passkey_figure(evals)
    return sections, figures


def run(cfg: ReportConfig) -> dict[str, Any]:
    out = Path(cfg.out_dir or f"mlruns/reports/{cfg.run}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    sources = report_sources.open_sources(cfg)
    dates = {run: day for source in sources for run, day in source.dates().items()}
    configs = [path for source in sources for path in source.configs()]  # downloaded once, read twice
    claim_ids, axes, resamples, matrix_keys, methods = report_sources.pipeline_settings(cfg, configs)
    found = report_sources.gather(sources, out, matrix_keys)
    index = found.results
    points = sorted(index.points("evaluate", "scale-search"))
    # The claims read a point's HeadScale (Fig 5), scale-search and evaluate runs by method.
    runs_by_point = {p: {**index.at("headscale", p), **index.at("scale-search", p), **index.at("evaluate", p)}
                     for p in points}
    sections, figures = [], {}
    if axes:
        text, figures["sweep.png"] = sweep.sweep_section(runs_by_point, axes, resamples)
        sections.append(text)
    else:
        for point in points:
            outcomes = [claims.evaluate_claim(CLAIMS_BY_ID[c], runs_by_point[point], resamples) for c in claim_ids]
            point_text, point_figures = point_sections(index.at("evaluate", point), index.at("scale-search", point),
                                                       outcomes, resamples, methods)
            if point:
                sections.append(f"## Matrix point {', '.join(f'{k} = {v}' for k, v in point)}")
                point_figures = {f"{_slug(point)}-{n}": f for n, f in point_figures.items()}
            sections += point_text
            figures.update(point_figures)
    # Paper 002: every grid's cells and attention analyses pooled (a study may span several files or seeds).
    if grid_list := index.results("synthetic-grid"):
        cells = [cell for grid in grid_list for cell in grid.runs]
        sections += [synthetic_claims.claims_table([*synthetic_claims.evaluate_claims(cells, resamples),
                                                    *attention_claims.evaluate_attention_claims(grid_list)]),
                     synthetic_learned.learned_table(cells), attention_claims.attention_table(grid_list),
                     synthetic_tables.exact_match_table(cells, resamples)]
        figures.update(synthetic_figures.study_figures(grid_list))
    if claim_ids and not axes:
        sections.insert(0, report_sections.changed_rules_section([CLAIMS_BY_ID[c] for c in claim_ids],
                                                                 list(dates.values())))
    sections.append(report_sections.recipe_section(found.recipes))
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(out / name, dpi=120, bbox_inches="tight")
            plots.plt.close(fig)
    sections += [md.read_text() for md in sorted(out.glob("*.md")) if md.name != "report.md"]
    pngs = sorted(p.name for p in out.glob("*.png"))
    pipelines = [p for source in sources for p in source.pipelines()]
    text = (f"# Report: {_pipelines_line(pipelines)}\n\n"
            + "\n\n".join(s for s in sections if s)
            + "\n\n## Plots\n\n" + "\n".join(f"![{p}]({p})" for p in pngs) + "\n")
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(markdown.html_page(text, out, f"Report: {pipelines[0][0]}"))
    Bundle(pipelines, configs, found.placed, found.recipes, found.files, dates).write(out / "results")
    if cfg.run:  # into the pipeline's own run (no run of its own): a rerun overwrites the same artifacts and metrics
        tracking.log_artifacts(cfg.tracking, cfg.run, out, "report")
        logged = tracking.client(cfg.tracking).get_run(cfg.run).data.metrics
        headline = comparison_metrics(index.at("evaluate", ())) if len(points) <= 1 else {}
        tracking.log_metrics(cfg.tracking, cfg.run, {k: v for k, v in headline.items()
                                                     if logged.get(k) != v})  # no duplicate points on a rerun
    return {"run_id": cfg.run, "markdown": str(out / "report.md"), "html": str(out / "report.html"),
            "methods": len({key.method for key in index if key.stage == "evaluate"})}


def _pipelines_line(pipelines: list[tuple[str, str]]) -> str:
    """``pipeline `a` (run 1), with pipeline `b` (runs 2, 3)``: the sources' pipeline runs, grouped by name in the
    order they first come (a study run as slices has many runs of one file)."""
    runs: dict[str, list[str]] = {}
    for name, run_id in pipelines:
        runs.setdefault(name, []).append(run_id)
    return ", with ".join(f"pipeline `{name}` (run{'s' if len(ids) > 1 else ''} {', '.join(ids)})"
                          for name, ids in runs.items())


def _slug(point: tuple) -> str:
    return "_".join(f"{k}{v}" for k, v in point)


def _seed_curves(by_seed: dict, curve: Callable[[EvaluationResult], Curve | None]) -> tuple | None:
    """A per-position curve (``curve`` of a run's results) over seeds: ``(x, mean, low, high)``, the band a t
    interval across seeds (one seed: the run's own bootstrap band)."""
    curves = [c for r in by_seed.values() if r.position is not None and (c := curve(r)) is not None]
    if not curves:
        return None
    edges = next(r.position.edges for r in by_seed.values() if r.position is not None)
    x = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    if len(curves) == 1:
        return x, curves[0].mean, curves[0].low, curves[0].high
    per_bucket = [t_interval([c.mean[b] for c in curves]) for b in range(len(x))]
    return x, [i.estimate for i in per_bucket], [i.low for i in per_bucket], [i.high for i in per_bucket]


def position_figure(evals: dict):
    logppl = {m: c for m, s in evals.items()
              if (c := _seed_curves(s, lambda r: r.position.logppl.get(r.corpora[0])))}
    entropy = {m: c for m, s in evals.items() if (c := _seed_curves(s, lambda r: r.position.entropy))}
    if not logppl:
        return None
    first = next(r for s in evals.values() for r in s.values() if r.position is not None)
    x = next(iter(logppl.values()))[0]
    bound = (x, list(np.log(np.asarray(x) + 1))) if entropy else None
    seeds = max(len(s) for s in evals.values())
    band = f"{seeds} seeds: mean, band = 95 % t interval across seeds" if seeds > 1 else "band = 95 % bootstrap"
    return plots.position_curves(logppl, entropy, first.train_len, bound,
                                 title=f"log-PPL and attention entropy by position ({band})")


def passkey_figure(evals: dict):
    """Fig 6: one passkey heat map (depth x length) per method, cells averaged over seeds."""
    panels = {}
    for method, by_seed in evals.items():
        cells: dict = defaultdict(list)
        for r in by_seed.values():
            for c in r.passkey.by_cell if r.passkey else []:
                cells[c.length, c.depth].append(c.accuracy)
        if cells:
            mean = {k: float(np.mean(v)) for k, v in cells.items()}
            panels[f"{method} (mean {np.mean(list(mean.values())):.2f})"] = mean
    return plots.passkey_heatmaps(panels) if panels else None


def comparison_metrics(evals: dict) -> dict[str, float]:
    """Per-method headline numbers for the pipeline run, so MLflow's runs table compares pipelines at a
    glance: ``<method>/test/len<N>/ppl`` (primary corpus; exp of the mean log-PPL over seeds) and
    ``<method>/passkey/mean``. Method labels are made metric-safe (MLflow allows letters, digits, ``_ - . / :``
    and spaces)."""
    out = {}
    for method, by_seed in evals.items():
        slug = re.sub(r"[^A-Za-z0-9_\-./: ]", "_", method)
        runs = list(by_seed.values())
        corpus, split = runs[0].corpora[0], runs[0].split
        for length in (runs[0].ppl or {}).get(corpus, {}):
            nll = [p.nll for r in runs if (p := r.perplexity(corpus, length)) is not None]
            out[f"{slug}/{split}/len{length}/ppl"] = math.exp(float(np.mean(nll)))
        accuracy = [r.passkey.overall for r in runs if r.passkey is not None]
        if accuracy:
            out[f"{slug}/passkey/mean"] = float(np.mean(accuracy))
    return out


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: ReportConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the pipeline run it reports on, the report's markdown and HTML files, the methods."""
    return {"run_id": str, "markdown": str, "html": str, "methods": int}
