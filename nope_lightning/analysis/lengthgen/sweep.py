"""The report's sweep section: how sharp NoPE's failure past L is at each point of a pipeline's matrix.

A pipeline with ``matrix`` and ``sweep: {x: <key>, lines: <key>}`` (``experiments/sharpness/sharpness.yaml``) runs the same
steps at every grid point; here every point gets the measures below, each pooled over seeds with its 95 %
interval by the claims' machinery (paired on the same windows, ``claims.measure``), then a table, a log-log
slope per line, and a plot of the measures against ``x`` with one line per value of ``lines``. The measures
compare methods by role (``config.SWEEP_ROLES``); the sweep setting names each role's step label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from nope_lightning.analysis.lengthgen import plots
from nope_lightning.analysis.lengthgen.claims import Runs, measure
from nope_lightning.analysis.markdown import cell, markdown_table
from nope_lightning.analysis.verdicts import NotMeasured
from nope_lightning.config.paper import Claim
from nope_lightning.config.pipeline import SWEEP_ROLES
from nope_lightning.numerics.stats import Interval

#: What each point reports: (key, label, test, methods, multiples, exponentiate). The methods are roles
#: (``SWEEP_ROLES``), which the sweep setting maps to step labels.
MEASURES = (
    ("nope_2x", "NoPE PPL(2L) / PPL(L)", "log_ppl_difference", ("nope", "nope"), (2, 1), True),
    ("nope_4x", "NoPE PPL(4L) / PPL(L)", "log_ppl_difference", ("nope", "nope"), (4, 1), True),
    ("nope_positions", "NoPE per-position PPL [2L, 4L) / [0, L)", "position_ratio", ("nope",), (2, 4), True),
    ("nope_entropy", "NoPE entropy rise, [2L, 4L) minus [0, L) (nats)", "entropy_rise", ("nope",), (2, 4), False),
    ("best_2x", "best lambda at 2x (validation)", "best_temperature", ("search",), (2,), False),
    ("gap_2x", "share of the 1x -> 2x gap the best lambda closes", "gap_closed", ("nope", "repaired"), (1, 2),
     False),
    ("rope_2x", "RoPE PPL(2L) / PPL(L)", "log_ppl_difference", ("rope", "rope"), (2, 1), True),
)
assert {role for *_, roles, _, _ in MEASURES for role in roles} <= set(SWEEP_ROLES)
#: The two measures plotted (one panel each).
PLOTTED = ("nope_2x", "gap_2x")


def point_measures(runs: Runs, labels: Mapping[str, str], resamples: int) -> dict[str, Interval]:
    """Every measure the point's runs allow (``labels``: role -> step label; a role without a label or runs:
    its measures are left out)."""
    out = {}
    for key, label, test, roles, multiples, exponentiate in MEASURES:
        if not set(roles) <= set(labels):
            continue
        claim = Claim(key, label, "", test, tuple(labels[role] for role in roles), multiples)
        try:
            interval, _ = measure(test, claim, runs, resamples)
        except NotMeasured:
            continue
        if exponentiate:
            interval = Interval(*(math.exp(v) for v in (interval.estimate, interval.low, interval.high)),
                                per_seed=tuple(math.exp(v) for v in interval.per_seed))
        out[key] = interval
    return out


def number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"sweep axis value {value!r} is not a number") from None


def sweep_section(points: Mapping[tuple, Runs], axes: Mapping[str, str], resamples: int) -> tuple[str, object]:
    """``(markdown, figure)``: the measures per point, the log-log slope of each plotted measure against
    ``axes["x"]`` per value of ``axes["lines"]``, and the plot; the other entries of ``axes`` map roles to
    step labels."""
    x_key, line_key = axes["x"], axes["lines"]
    labels = {role: label for role, label in axes.items() if role in SWEEP_ROLES}
    measured = {point: point_measures(runs, labels, resamples) for point, runs in points.items()}
    keys = [m for m in MEASURES if any(m[0] in v for v in measured.values())]
    rows = []
    for point, values in sorted(measured.items(), key=lambda kv: (number(dict(kv[0])[line_key]),
                                                                   number(dict(kv[0])[x_key]))):
        where = dict(point)
        seeds = max((len(s) for s in points[point].values()), default=0)
        rows.append([where[line_key], where[x_key], seeds,
                     *[cell(values.get(k), "{:.3f}".format) for k, *_ in keys]])
    header = [line_key, x_key, "seeds", *[label for _, label, *_ in keys]]
    slopes = [_slope_line(measured, x_key, line_key, key) for key in PLOTTED]
    text = (f"### Sweep over `{x_key}`, one line per `{line_key}`\n\nPooled over seeds (mean of per-seed effects, 95 % bootstrap "
            f"interval over blocks of windows, paired across lengths on the same target tokens).\n\n"
            + markdown_table(header, rows) + "\n\n" + "\n".join(s for s in slopes if s))
    return text, _figure(measured, x_key, line_key)


def _series(measured: dict, x_key: str, line_key: str, key: str) -> dict[str, list[tuple[float, Interval]]]:
    series: dict[str, list[tuple[float, Interval]]] = {}
    for point, values in measured.items():
        if key in values:
            where = dict(point)
            series.setdefault(where[line_key], []).append((number(where[x_key]), values[key]))
    return {line: sorted(s, key=lambda p: p[0]) for line, s in sorted(series.items(), key=lambda kv: number(kv[0]))}


def _slope_line(measured: dict, x_key: str, line_key: str, key: str) -> str:
    """'slope of log(measure) vs log(x)' per line (least squares through the point estimates)."""
    label = next(label for k, label, *_ in MEASURES if k == key)
    parts = []
    for line, series in _series(measured, x_key, line_key, key).items():
        xs = np.log([x for x, _ in series])
        ys = [iv.estimate for _, iv in series]
        if len(series) >= 2 and all(y > 0 for y in ys):
            slope = np.polyfit(xs, np.log(ys), 1)[0]
            parts.append(f"{line_key} = {line}: {slope:+.3f}")
    return f"Log-log slope of {label} against {x_key}: " + "; ".join(parts) + "." if parts else ""


def _figure(measured: dict, x_key: str, line_key: str):
    fig, axes = plots.plt.subplots(1, len(PLOTTED), figsize=(5.5 * len(PLOTTED), 4))
    for ax, key in zip(axes, PLOTTED, strict=True):
        label = next(label for k, label, *_ in MEASURES if k == key)
        for line, series in _series(measured, x_key, line_key, key).items():
            style = plots.method_style(f"{line_key}={line}")
            x = [p for p, _ in series]
            y = np.array([iv.estimate for _, iv in series])
            err = np.array([[iv.estimate - iv.low for _, iv in series], [iv.high - iv.estimate for _, iv in series]])
            ax.errorbar(x, y, yerr=err, label=f"NoPE, {line_key} = {line}", capsize=3, **style)
        if key == "nope_2x":
            for line, series in _series(measured, x_key, line_key, "rope_2x").items():
                ax.scatter([p for p, _ in series], [iv.estimate for _, iv in series], marker="x", s=40,
                           label=f"RoPE, {line_key} = {line}")
        ax.set_xscale("log")
        ax.set_xlabel(x_key.replace("_", " "))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
