"""``report``: markdown tables and PNG plots from the runs of a pipeline, with the papers' numbers beside ours.

Reads its sources (``analysis/sources.py``: pipeline runs in MLflow stores, results bundles earlier reports wrote)
and files their results in one index by stage, matrix point, method and seed (``results/index.py``, keyed by each
run's ``RunKey``). It tests the pipeline's claims (``analysis/lengthgen/claims.py``; paper 002's:
``analysis/synthetic/``; over several files, every file's and those only the files together can judge, such as NoPE
against RoPE run from files of their own: ``study_claims.py``), writes the tables (``analysis/lengthgen/tables.py``;
the baselines beside NoPE with Fig 2 right and Fig 6: ``baselines.py``) or, for a sweep, the sweep section
(``analysis/lengthgen/sweep.py``), the figures with their bands, ``report.md``, a self-contained ``report.html``
and the results it read (``results/``, a bundle: ``results/bundle.py``) under ``out_dir``, and logs them, with
per-method headline metrics, to the pipeline run itself (artifact folder ``report/``; a rerun overwrites them, so
there is one report per pipeline run). What it knows of each method (the paper row it sits beside, its family, the
paired table's reference) is the experiment file's (``sources.Methods``), never read from the method's label. The
report is titled by its study's name (``report_frame.study_name``: the words its pipelines' names share, e.g.
``regime_study`` for ``regime_study`` and its seed files ``regime_study_s5678``, …), captions every figure with
what it shows and over which seeds, and ends with its provenance: each pipeline run's name, id, day and the store
or bundle it was read from, and the rows a later source measured again and the report did not count.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nope_lightning.analysis import markdown, report_frame, rule_changes
from nope_lightning.analysis import sources as report_sources
from nope_lightning.analysis.lengthgen import claims, entropy_figures, plots, report_sections, sweep, tables
from nope_lightning.analysis.lengthgen.baselines import baseline_sections
from nope_lightning.analysis.lengthgen.fig5 import fig5_figures, fig5_section
from nope_lightning.analysis.lengthgen.study_claims import study_claims
from nope_lightning.analysis.report_frame import Plot, over_seeds, seeds
from nope_lightning.analysis.synthetic import attention_claims
from nope_lightning.analysis.synthetic import claims as synthetic_claims
from nope_lightning.analysis.synthetic import figures as synthetic_figures
from nope_lightning.analysis.synthetic import judge as synthetic_judge
from nope_lightning.analysis.synthetic import learned as synthetic_learned
from nope_lightning.analysis.synthetic import tables as synthetic_tables
from nope_lightning.config.core import load_config
from nope_lightning.config.paper import CLAIMS_BY_ID
from nope_lightning.config.pipeline import PipelineConfig, ReportConfig
from nope_lightning.numerics.stats import t_interval
from nope_lightning.results.bundle import Bundle
from nope_lightning.results.evaluation import Curve, EvaluationResult
from nope_lightning.results.headscale import HeadScaleResult
from nope_lightning.runtime import tracking
from nope_lightning.stages.headscale import PARAMETERIZATIONS

#: The Fig 5 file a HeadScale run draws (``plots/entropy_vs_lambda.png``); the report draws it again under the
#: name the run's copy has, so that its title names the method and seed.
FIG5 = "entropy_vs_lambda.png"


def point_sections(evals: dict, searches: dict, headscales: dict, outcomes: list, resamples: int,
                   methods: report_sources.Methods, seed_days: dict | None = None, row_days: dict | None = None
                   ) -> tuple[list[str], dict[str, Plot | None]]:
    """The tables and figures of one matrix point (``seed_days``: seed -> the day its run started; ``row_days``:
    (method, seed) -> the day its row was made)."""
    beside, figures = baseline_sections(evals, searches, methods)  # RoPE's rows beside NoPE's, if any
    sections = [report_sections.retrieval_line(claims.retrieval_by_seed(evals)) if outcomes else "",
                report_sections.claims_table(outcomes, seed_days, row_days) if outcomes else "",
                tables.ppl_tables(evals, methods.paper_rows("table2")) if evals else "", beside,
                tables.bucket_table(evals),
                tables.ablation_table(evals, outcomes, methods.paper_rows("table4")), tables.passkey_table(evals),
                report_sections.retrieval_table(evals), fig5_section({**headscales, **evals}, seed_days, row_days),
                tables.key_nll_table(evals), tables.longctx_table(evals),
                *(tables.paired_table(evals, resamples, reference) for reference in methods.references),
                *(report_sections.search_section(method, by_seed) for method, by_seed in searches.items())]
    for n, (method, by_seed) in enumerate(searches.items()):
        for seed, summary in by_seed.items():  # the first search's names stay; another's name it (RoPE's beside NoPE's)
            name = f"lambda_fit{f'_{method}' if n else ''}{'' if seed is None else f'_s{seed}'}.png"
            title = f"{_named(method, seed)}: uniform temperature search"
            figures[name] = Plot(plots.lambda_fit(summary, title), (
                f"Uniform-scale search `{method}`, {seeds([seed])}: the best lambda per position bucket "
                "(s = position / train length) with the fit 1 + a ln s, and the best lambda per target "
                "length (stars)."))
    figures.update(fig5_plots(headscales))
    figures.update(fig5_figures({**headscales, **evals}))
    if evals:
        # Fig 1/4: the NoPE family (plain, uniform lambda, HeadScale), then the baselines beside the reference.
        nope_family = {m: s for m, s in evals.items() if m in methods.nope_family}
        baselines = {m: s for m, s in evals.items() if m not in nope_family or m == methods.reference}
        beside = f" beside {methods.reference}" if methods.reference in baselines else ""
        who = (f"Baselines{beside}" if set(baselines) - {methods.reference}
               else f"Reference {methods.reference}, no baseline run")  # drawn all the same, as it always was
        figures["position_curves_nope.png"] = position_figure(nope_family, "NoPE and its repairs")
        figures["position_curves_baselines.png"] = position_figure(baselines, who)
        figures["passkey_heatmaps.png"] = passkey_figure(evals)
        figures["entropy_heads_past_L.png"] = entropy_figures.fig3_plot(evals)
        figures["entropy_heads_by_position.png"] = entropy_figures.fig10_plot(evals, methods.reference)
    return sections, figures


def run(cfg: ReportConfig) -> dict[str, Any]:
    out = Path(cfg.out_dir or f"mlruns/reports/{cfg.run}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    sources = report_sources.open_sources(cfg)
    dates = {run: day for source in sources for run, day in source.dates().items()}
    machines = {run: names for source in sources for run, names in source.machines().items()}
    configs = [path for source in sources for path in source.configs()]  # downloaded once, read twice
    claim_ids, axes, resamples, matrix_keys, methods = report_sources.pipeline_settings(cfg, configs)
    if cfg.claims is None:  # a study split into files judges every file's claims, and those only files together can
        claim_ids = study_claims(claim_ids, [load_config(PipelineConfig, p) if p else None for p in configs])
    found = report_sources.gather(sources, out, matrix_keys)
    index = found.results
    points = sorted(index.points("evaluate", "scale-search"))
    run_ids = [run for s in sources for _, run in s.pipelines()]
    seed_days, row_days = (report_sources.seed_days(configs, run_ids, dates),
                           report_sources.row_days(configs, run_ids, dates))
    # The claims read a point's HeadScale (Fig 5), scale-search and evaluate runs by method.
    runs_by_point = {p: {**index.at("headscale", p), **index.at("scale-search", p), **index.at("evaluate", p)}
                     for p in points}
    sections: list[str] = []
    figures: dict[str, Plot | None] = {}
    if axes:
        text, figure = sweep.sweep_section(runs_by_point, axes, resamples)
        swept = [s for runs in runs_by_point.values() for by_seed in runs.values() for s in by_seed]
        figures["sweep.png"] = Plot(figure, (f"The sweep's plotted measures against `{axes['x']}`, one "
                                             f"line per `{axes['lines']}` (mean of per-seed effects, 95 % "
                                             f"bootstrap intervals), pooled over {seeds(swept)}."))
        sections.append(text)
    else:
        for point in points:
            outcomes = [claims.evaluate_claim(CLAIMS_BY_ID[c], runs_by_point[point], resamples) for c in claim_ids]
            point_text, point_figures = point_sections(
                index.at("evaluate", point), index.at("scale-search", point), index.at("headscale", point),
                outcomes, resamples, methods, seed_days, row_days)
            if point:
                where = ", ".join(f"{k} = {v}" for k, v in point)
                sections.append(f"## Matrix point {where}")
                point_figures = {f"{_slug(point)}-{n}": p and Plot(p.figure, f"Matrix point {where}. "
                                                                             f"{p.caption}")
                                 for n, p in point_figures.items()}
            sections += point_text
            figures.update(point_figures)
    # Paper 002: every grid's cells and attention analyses pooled (a study may span several files or seeds).
    if grid_list := index.results("synthetic-grid"):
        cells = [cell for grid in grid_list for cell in grid.runs]
        sections += [rule_changes.changed_rules_section(synthetic_claims.SYNTHETIC_CLAIMS, list(dates.values())),
                     synthetic_tables.claims_table([*synthetic_judge.evaluate_claims(cells, resamples),
                                                    *attention_claims.evaluate_attention_claims(grid_list)], seed_days),
                     synthetic_learned.learned_table(cells), attention_claims.attention_table(grid_list),
                     synthetic_tables.exact_match_table(cells, resamples),
                     synthetic_tables.scratchpad_errors_table(cells)]
        figures.update(synthetic_figures.study_figures(grid_list))
    if claim_ids and not axes:
        sections.insert(0, rule_changes.changed_rules_section([CLAIMS_BY_ID[c] for c in claim_ids],
                                                              list(dates.values())))
    sections.append(report_frame.recipe_section(found.recipes))
    captions = {}
    for name, plot in figures.items():
        if plot is not None and plot.figure is not None:
            plot.figure.savefig(out / name, dpi=120, bbox_inches="tight")
            plots.plt.close(plot.figure)
            captions[name] = plot.caption
    for path in found.files:  # what runs drew themselves, unless drawn again above
        if path.suffix == ".png" and path.name not in captions:
            method, _, made = path.name.rpartition("-")
            captions[path.name] = (f"`{made}`, drawn by the `{method}` run itself, "
                                   f"{seeds([found.first_seed])}.")
    sections += [md.read_text() for md in sorted(out.glob("*.md")) if md.name != "report.md"]
    read = [(name, run_id, source.origin) for source in sources for name, run_id in source.pipelines()]
    pipelines = [(name, run_id) for name, run_id, _ in read]
    text = "\n\n".join(s for s in [report_frame.heading(pipelines), *sections,
                                     report_frame.plots_section(sorted(captions), captions),
                                     report_frame.provenance_section(read, dates, machines), index.remeasured_line(),
                                     report_sources.reading_line(cfg, sources)] if s) + "\n"
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(markdown.html_page(text, out,
                                                        f"Report: {report_frame.study_name(pipelines)}"))
    Bundle(pipelines, configs, found.placed, found.recipes, found.files, dates, machines).write(out / "results")
    if cfg.run:  # into the pipeline's own run (no run of its own): a rerun overwrites the same artifacts and metrics
        tracking.log_artifacts(cfg.tracking, cfg.run, out, "report")
        logged = tracking.client(cfg.tracking).get_run(cfg.run).data.metrics
        headline = comparison_metrics(index.at("evaluate", ())) if len(points) <= 1 else {}
        tracking.log_metrics(cfg.tracking, cfg.run, {k: v for k, v in headline.items()
                                                     if logged.get(k) != v})  # no duplicate points on a rerun
    return {"run_id": cfg.run, "markdown": str(out / "report.md"), "html": str(out / "report.html"),
            "methods": len({key.method for key in index if key.stage == "evaluate"})}


def _named(method: str, seed: int | None) -> str:
    """A figure title's 'method, seed 1234' (a run without a replicate seed: the method alone)."""
    return method if seed is None else f"{method}, seed {seed}"


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


def position_figure(evals: dict, who: str) -> Plot | None:
    """Fig 1/4: per-position log-PPL and attention entropy of ``who`` (the methods of ``evals``), over
    seeds."""
    logppl = {m: c for m, s in evals.items()
              if (c := _seed_curves(s, lambda r: r.position.logppl.get(r.corpora[0])))}
    entropy = {m: c for m, s in evals.items() if (c := _seed_curves(s, lambda r: r.position.entropy))}
    if not logppl:
        return None
    first = next(r for s in evals.values() for r in s.values() if r.position is not None)
    x = next(iter(logppl.values()))[0]
    bound = (x, list(np.log(np.asarray(x) + 1))) if entropy else None
    count = max(len(s) for s in evals.values())
    band = "95 % t interval across seeds" if count > 1 else "95 % bootstrap interval of the run"
    drawn = {m: [s for s, r in evals[m].items() if r.position is not None] for m in logppl}
    short = "95 % t" if count > 1 else "95 % bootstrap"  # a title within the axes keeps the figure size
    title = f"{who}: log-PPL and entropy by position ({count} seed{'s' * (count > 1)}, {short} band)"
    return Plot(plots.position_curves(logppl, entropy, first.train_len, bound, title=title),
                f"{who}: per-position log-PPL (top) and attention entropy (bottom) of "
                f"{', '.join(f'`{m}`' for m in logppl)}, {over_seeds(drawn)}; band: {band}; dashed: the "
                f"training length {first.train_len}"
                + ("; dotted: log i, uniform attention." if bound else "."))


def passkey_figure(evals: dict) -> Plot | None:
    """Fig 6: one passkey heat map (depth x length) per method, cells averaged over seeds."""
    panels, scored = {}, {}
    for method, by_seed in evals.items():
        cells: dict = defaultdict(list)
        for r in by_seed.values():
            for c in r.passkey.by_cell if r.passkey else []:
                cells[c.length, c.depth].append(c.accuracy)
        if cells:
            mean = {k: float(np.mean(v)) for k, v in cells.items()}
            panels[f"{method} (mean {np.mean(list(mean.values())):.2f})"] = mean
            scored[method] = [s for s, r in by_seed.items() if r.passkey]
    if not panels:
        return None
    return Plot(plots.passkey_heatmaps(panels), "Passkey accuracy per (prompt length, key depth) cell of "
                f"each method (its mean over the cells in the panel's title), {over_seeds(scored)}.")


def fig5_plots(headscales: dict[str, dict[int | None, HeadScaleResult]]) -> dict[str, Plot]:
    """Fig 5 of each HeadScale method: its learned per-head table against the heads' converged entropy, at the
    first seed read that measured them. The run drew the same figure (its copy has this name) under a title
    naming neither method nor seed; drawn again here from its results, the two differ in the title only."""
    out = {}
    for method, by_seed in headscales.items():
        measured = [(s, r) for s, r in by_seed.items() if r.converged_entropy is not None]
        if not measured:
            continue
        seed, result = measured[0]
        param = next((p for p in PARAMETERIZATIONS.values()
                      if (p.symbol, p.table.units) == (result.symbol, result.units)), None)
        if param is None:  # a table this code does not know: the run's own figure stays, as it drew it
            continue
        what = param.axis.split(" (")[0]
        figure = plots.learned_vs_entropy(np.asarray(result.converged_entropy.per_head),
                                          np.asarray(result.table), result.target_len, param.axis,
                                          param.floors[0], f"{_named(method, seed)}, at {result.target_len}")
        out[report_sources.run_file_name(method, FIG5)] = Plot(figure, (
            f"HeadScale `{method}` (Fig 5): each head's learned {what} against its converged attention "
            f"entropy at {result.target_len} tokens, one colour per layer, {seeds([seed])} (the first seed "
            "read)."))
    return out


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
