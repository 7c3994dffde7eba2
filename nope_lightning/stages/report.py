"""``report``: markdown tables and PNG plots from the runs of a pipeline, with the papers' numbers beside ours.

Reads the pipeline's child runs from MLflow (evaluate ``results.json``, scale-search ``scale_search.json``,
HeadScale and synthetic artifacts), writes ``report.md`` + PNGs under ``out_dir`` and logs them to a
``report`` run nested under the pipeline. Methods are the pipeline steps' labels (tag ``method``).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from nope_lightning import paper, tracking
from nope_lightning.config import ReportConfig


def child_runs(cfg: ReportConfig) -> list:
    """Direct children of the pipeline run, oldest first."""
    client = tracking.client(cfg.tracking)
    parent = client.get_run(cfg.run)
    return client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{cfg.run}'",
                              order_by=["attributes.start_time ASC"], max_results=5000)


def _artifact_json(cfg: ReportConfig, run_id: str, path: str) -> dict | None:
    names = {a.path for a in tracking.client(cfg.tracking).list_artifacts(run_id, str(Path(path).parent)
                                                                         if "/" in path else None)}
    if path not in names:
        return None
    return json.loads(tracking.download(cfg.tracking, run_id, path).read_text())


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ppl_tables(evals: dict[str, dict]) -> str:
    """Table 2 analog: PPL per method x length for each corpus, with the paper's row where it has one."""
    out = []
    first = next(iter(evals.values()))
    train_len = first["train_len"]
    for corpus in first["corpora"]:
        lengths = sorted({int(n) for r in evals.values() for n in r["ppl"].get(corpus, {})})
        reference = paper.TABLE2_PROOFPILE if corpus in ("math", "code") else paper.TABLE2_PG19
        header = ["method", *[f"{n} ({n / train_len:g}x)" for n in lengths], "paper 1x/2x/4x/8x"]
        rows = []
        for method, r in evals.items():
            values = r["ppl"].get(corpus, {})
            cells = [paper.fmt(values[str(n)]["ppl"]) if str(n) in values else "" for n in lengths]
            ref = reference.get(method)
            rows.append([method, *cells, " / ".join(paper.fmt(v) for v in ref) if ref else "—"])
        name = "PG19" if reference is paper.TABLE2_PG19 else "Proof-pile"
        out.append(f"### Perplexity on `{corpus}` (test split; paper column: {name}, TinyLlama-1.1B at 2K)\n\n"
                   + markdown_table(header, rows))
    return "\n\n".join(out)


def passkey_table(evals: dict[str, dict]) -> str:
    with_keys = {m: r["passkey"] for m, r in evals.items() if "passkey" in r}
    if not with_keys:
        return ""
    lengths = sorted({int(n) for p in with_keys.values() for n in p["by_length"]})
    rows = [[m, *[f"{p['by_length'].get(str(n), float('nan')):.2f}" for n in lengths], f"{p['overall']:.2f}"]
            for m, p in with_keys.items()]
    return "### Passkey retrieval accuracy\n\n" + markdown_table(["method", *map(str, lengths), "mean"], rows)


def longctx_table(evals: dict[str, dict]) -> str:
    with_tasks = {m: r["longctx"] for m, r in evals.items() if r.get("longctx")}
    if not with_tasks:
        return ""
    tasks = sorted({t for v in with_tasks.values() for t in v})
    rows = [[m, *[f"{np.mean(list(v[t].values())):.2f}" if t in v else "" for t in tasks]]
            for m, v in with_tasks.items()]
    return ("### Offline long-context tasks (mean score over lengths, 0-1)\n\n"
            + markdown_table(["method", *tasks], rows))


def ablation_table(evals: dict[str, dict]) -> str:
    """Table 4 analog over the HeadScale variants: PPL at the longest length, passkey and long-context means."""
    rows = []
    for method, r in evals.items():
        if not method.startswith("headscale"):
            continue
        corpus, longest = r["corpora"][0], str(max(r["lengths"]))
        ppl = r["ppl"][corpus][longest]["ppl"]
        passkey = r.get("passkey", {}).get("overall", float("nan"))
        longctx = np.mean([np.mean(list(v.values())) for v in r.get("longctx", {}).values()] or [float("nan")])
        key = ("headscale w/o constraint" if "constraint" in method else "headscale w/o init" if "init" in method
               else "headscale")
        ref = paper.TABLE4[key]
        rows.append([method, paper.fmt(ppl), f"{passkey:.2f}", f"{longctx:.2f}",
                     f"{ref['pg19']} / {ref['passkey']}% / {ref['longbench']}"])
    if not rows:
        return ""
    return ("### HeadScale ablations (Table 4 analog)\n\n"
            + markdown_table(["method", "PPL @ longest", "passkey", "long-context", "paper PPL@16K / passkey / "
                              "LongBench"], rows))


def position_figure(evals: dict[str, dict], train_len: int):
    from nope_lightning.eval import plots

    def centers(edges):
        return [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]

    logppl = {m: (centers(r["position"]["edges"]), next(iter(r["position"]["logppl"].values())))
              for m, r in evals.items() if "position" in r}
    entropy = {m: (centers(r["entropy"]["edges"]), r["entropy"]["mean"]) for m, r in evals.items() if "entropy" in r}
    if not logppl:
        return None
    edges = next(r["entropy"]["edges"] for r in evals.values() if "entropy" in r) if entropy else None
    bound = (centers(edges), list(np.log(np.asarray(centers(edges)) + 1))) if edges else None
    return plots.position_curves(logppl, entropy, train_len, bound, title="log-PPL and attention entropy by position")


def passkey_figure(evals: dict[str, dict]):
    import matplotlib.pyplot as plt

    with_keys = {m: r["passkey"] for m, r in evals.items() if "passkey" in r}
    if not with_keys:
        return None
    cols = min(4, len(with_keys))
    rows = math.ceil(len(with_keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, (method, p) in zip(axes.flat, with_keys.items(), strict=False):
        cells = {(int(n), float(d)): a for n, d, a in p["by_cell"]}
        lengths, depths = sorted({n for n, _ in cells}), sorted({d for _, d in cells})
        grid = np.array([[cells.get((n, d), np.nan) for n in lengths] for d in depths])
        ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{round(100 * d)}%" for d in depths], fontsize=7)
        ax.set_title(f"{method} (mean {p['overall']:.2f})", fontsize=9)
    for ax in list(axes.flat)[len(with_keys):]:
        ax.axis("off")
    fig.supxlabel("prompt length (tokens)")
    fig.supylabel("key depth")
    fig.tight_layout()
    return fig


def run(cfg: ReportConfig) -> dict[str, Any]:
    from nope_lightning.eval import plots

    out = Path(cfg.out_dir or f"mlruns/reports/{cfg.run}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    evals: dict[str, dict] = {}
    sections, figures = [], {}
    pipeline = tracking.client(cfg.tracking).get_run(cfg.run)
    for run in child_runs(cfg):
        stage, method = run.data.tags.get("stage"), run.data.tags.get("method", run.info.run_name)
        if stage == "evaluate":
            evals[method] = _artifact_json(cfg, run.info.run_id, "results.json")
        elif stage == "scale-search" and (summary := _artifact_json(cfg, run.info.run_id, "scale_search.json")):
            figures["lambda_fit.png"] = plots.lambda_fit(summary)
            fit = summary["fit"]
            sections.append(f"### Uniform-scale search ({method})\n\nBest lambda per target length (units of "
                            f"1/sqrt(d)): " + ", ".join(f"{n}: {lam}" for n, lam in summary["best"].items())
                            + f". Fit lambda = 1 + a ln s: a = {fit['a']:.3f}, R^2 = {fit['r2']:.2f}.")
        _copy_pngs(cfg, run, out, method)
    evals = {m: r for m, r in evals.items() if r}
    if evals:
        train_len = next(iter(evals.values()))["train_len"]
        sections = [ppl_tables(evals), ablation_table(evals), passkey_table(evals), longctx_table(evals), *sections]
        # Fig 1/4: the NoPE family (plain, uniform lambda, HeadScale), then the position-encoding baselines.
        nope_family = {m: r for m, r in evals.items() if m.startswith(("nope", "headscale"))}
        baselines = {m: r for m, r in evals.items() if m not in nope_family or m == "nope"}
        figures["position_curves_nope.png"] = position_figure(nope_family, train_len)
        figures["position_curves_baselines.png"] = position_figure(baselines, train_len)
        figures["passkey_heatmaps.png"] = passkey_figure(evals)
    report_run = tracking.create_run(cfg.tracking, "report", f"report-{pipeline.info.run_name}", cfg)
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(out / name, dpi=120, bbox_inches="tight")
            tracking.log_figure(cfg.tracking, report_run, fig, f"report/{name}")
    sections += [md.read_text() for md in sorted(out.glob("*.md")) if md.name != "report.md"]
    pngs = sorted(p.name for p in out.glob("*.png"))
    text = (f"# Report: pipeline `{pipeline.info.run_name}` (run {cfg.run})\n\n"
            + "\n\n".join(s for s in sections if s)
            + "\n\n## Plots\n\n" + "\n".join(f"![{p}]({p})" for p in pngs) + "\n")
    (out / "report.md").write_text(text)
    tracking.log_artifacts(cfg.tracking, report_run, out, "report")
    tracking.end_run(cfg.tracking, report_run)
    print(text)
    return {"run_id": report_run, "markdown": str(out / "report.md"), "methods": len(evals)}


def _copy_pngs(cfg: ReportConfig, run, out: Path, method: str) -> None:
    """Bring the PNGs that HeadScale and synthetic runs made themselves (Fig 5, per-length accuracy)."""
    if run.data.tags.get("stage") not in ("headscale", "synthetic-grid", "synthetic"):
        return
    client = tracking.client(cfg.tracking)
    for folder in (None, "plots", "headscale"):
        for artifact in client.list_artifacts(run.info.run_id, folder):
            if artifact.path.endswith(".png"):
                local = tracking.download(cfg.tracking, run.info.run_id, artifact.path)
                shutil.copy(local, out / f"{method.replace(' ', '_')}-{Path(artifact.path).name}")
            elif artifact.path.endswith(".md"):
                text = tracking.download(cfg.tracking, run.info.run_id, artifact.path).read_text()
                (out / f"{method.replace(' ', '_')}-{Path(artifact.path).name}").write_text(text)
