"""``scale-search``'s result (``scale_search.json``): the best uniform temperature lambda (units of
1/sqrt(d)) per target length and per position bucket, the fit ``lambda = 1 + a ln s`` (s = position / L),
their bootstrap intervals, and every trial's per-window validation data behind them. Lengths are in tokens,
log-PPL in nats; on disk, mappings keyed by a target length have string keys."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nope_lightning.results.core import ResultFile, int_keys


@dataclass(frozen=True)
class SearchSamples:
    """Every trial's validation data, trials in grid order: ``windows[n]`` (trials, windows, 2) NLL sum and
    count at target n; ``position`` (trials, windows, buckets) NLL sums over the position windows' buckets
    ``edges``; ``doc`` the scoring windows' documents (bootstrap blocks never span two)."""

    doc: list[int]
    edges: list[int]
    windows: dict[int, list]
    position: list

    def body(self) -> dict[str, Any]:
        return {"doc": self.doc, "edges": self.edges, "windows": self.windows, "position": self.position}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SearchSamples:
        return cls(data["doc"], data.get("edges", []), int_keys(data["windows"]), data.get("position", []))


@dataclass(frozen=True)
class SearchTrial:
    """One trial: its temperature, validation log-PPL per target, the evaluate run and its replay command."""

    temperature: float
    logppl: dict[int, float] = field(default_factory=dict)
    evaluate_run_id: str | None = None
    command: str | None = None

    def body(self) -> dict[str, Any]:
        return {"lambda": self.temperature, "logppl": self.logppl, "evaluate_run_id": self.evaluate_run_id,
                "command": self.command}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SearchTrial:
        return cls(data["lambda"], int_keys(data.get("logppl", {})), data.get("evaluate_run_id"), data.get("command"))


@dataclass(frozen=True)
class PositionBest:
    """The best temperature of one position bucket past L: its center (tokens) and s = center / L."""

    position: float
    s: float
    temperature: float


@dataclass(frozen=True)
class LogFit:
    """``lambda = 1 + a ln s`` through the per-bucket best temperatures, and its R^2 (NaN: fewer than two
    buckets past L)."""

    a: float = math.nan
    r2: float = math.nan


@dataclass(frozen=True)
class SelectionIntervals:
    """95 % bootstrap intervals (low, high) of the best temperature per target and of the fit's a and R^2
    (None when there is no fit)."""

    best: dict[int, tuple[float, float]] = field(default_factory=dict)
    a: tuple[float, float] | None = None
    r2: tuple[float, float] | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"best": {n: list(i) for n, i in self.best.items()}}
        if self.a is not None and self.r2 is not None:
            out["fit"] = {"a": list(self.a), "r2": list(self.r2)}
        return out

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SelectionIntervals:
        fit = data.get("fit", {})
        return cls({n: tuple(i) for n, i in int_keys(data.get("best", {})).items()},
                   tuple(fit["a"]) if "a" in fit else None, tuple(fit["r2"]) if "r2" in fit else None)


@dataclass(frozen=True)
class ScaleSearchResult(ResultFile):
    """One search on one model (``model_fingerprint``: its weights' sha256): the best temperature per target
    (``best_on_grid_edge``: it lies on the grid's edge, ``grid`` = (min, max), so the optimum may lie beyond)
    and its validation log-PPL, the per-bucket bests and their fit, intervals, samples and trials."""

    KIND = "scale-search"

    train_len: int
    best: dict[int, float]
    study: str = ""
    model_fingerprint: str = ""
    split: str = "val"
    checkpoint: str = ""
    units: str = "1/sqrt(head_size)"
    grid: tuple[float, float] = (math.nan, math.nan)
    best_on_grid_edge: dict[int, bool] = field(default_factory=dict)
    best_logppl: dict[int, float] = field(default_factory=dict)
    per_position_best: list[PositionBest] = field(default_factory=list)
    fit: LogFit = field(default_factory=LogFit)
    intervals: SelectionIntervals = field(default_factory=SelectionIntervals)
    samples: SearchSamples | None = None
    trials: list[SearchTrial] = field(default_factory=list)

    @property
    def temperatures(self) -> list[float]:
        """The trials' temperatures, in grid order."""
        return [t.temperature for t in self.trials]

    def body(self) -> dict[str, Any]:
        return {"study": self.study, "model_fingerprint": self.model_fingerprint, "train_len": self.train_len,
                "split": self.split, "checkpoint": self.checkpoint, "units": self.units, "grid": list(self.grid),
                "best": self.best, "best_on_grid_edge": self.best_on_grid_edge, "best_logppl": self.best_logppl,
                "per_position_best": [{"position": p.position, "s": p.s, "lambda": p.temperature}
                                      for p in self.per_position_best],
                "fit": {"a": self.fit.a, "r2": self.fit.r2}, "intervals": self.intervals.body(),
                "samples": None if self.samples is None else self.samples.body(),
                "trials": [t.body() for t in self.trials]}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> ScaleSearchResult:
        fit = data.get("fit", {})
        return cls(
            data["train_len"], int_keys(data["best"]), data.get("study", ""), data.get("model_fingerprint", ""),
            data.get("split", "val"), data.get("checkpoint", ""), data.get("units", "1/sqrt(head_size)"),
            tuple(data.get("grid", (math.nan, math.nan))), int_keys(data.get("best_on_grid_edge", {})),
            int_keys(data.get("best_logppl", {})),
            [PositionBest(p["position"], p["s"], p["lambda"]) for p in data.get("per_position_best", [])],
            LogFit(fit.get("a", math.nan), fit.get("r2", math.nan)),
            SelectionIntervals.parse(data.get("intervals", {})),
            SearchSamples.parse(data["samples"]) if data.get("samples") is not None else None,
            [SearchTrial.parse(t) for t in data.get("trials", [])])
