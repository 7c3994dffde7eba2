"""``evaluate``'s result (``results.json``): every figure with the per-window / per-prompt data behind it.

Lengths and positions are in tokens, log-PPL and entropy in nats. On disk, mappings keyed by a length have
string keys (JSON's), pairs are lists; here they are ints and tuples again. A section an evaluation did not
run is ``None`` and absent from the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nope_lightning.results.core import ResultFile, int_keys
from nope_lightning.results.passkey import PasskeyResults


@dataclass(frozen=True)
class Perplexity:
    """One corpus at one length: PPL, mean NLL (nats/token) over ``tokens`` targets and the NLL's 95 % interval
    (block bootstrap over windows)."""

    ppl: float
    nll: float
    tokens: int
    nll_low: float
    nll_high: float

    def body(self) -> dict[str, Any]:
        return {"ppl": self.ppl, "nll": self.nll, "tokens": self.tokens, "nll_low": self.nll_low,
                "nll_high": self.nll_high}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Perplexity:
        return cls(data["ppl"], data["nll"], data["tokens"], data["nll_low"], data["nll_high"])


@dataclass(frozen=True)
class ScoredWindows:
    """One corpus's scoring windows, the same at every length: each window's document and last target token
    (``doc``, ``end``), and per length (tokens) the windows' (NLL sum, token count) rows, (windows, 2)."""

    doc: list[int]
    end: list[int]
    rows: dict[int, list[list[float]]]

    def body(self) -> dict[str, Any]:
        return {"doc": self.doc, "end": self.end, **self.rows}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> ScoredWindows:
        rows = {k: v for k, v in data.items() if k not in ("doc", "end")}
        return cls(data["doc"], data["end"], int_keys(rows))


@dataclass(frozen=True)
class Curve:
    """A per-position curve over position ranges: the mean per range with its 95 % interval (bootstrap over
    windows), and each window's sum over each range, (windows, ranges)."""

    mean: list[float]
    low: list[float]
    high: list[float]
    windows: list[list[float]]

    def body(self) -> dict[str, Any]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "windows": self.windows}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Curve:
        return cls(data.get("mean", []), data.get("low", []), data.get("high", []), data["windows"])


def _curves(data: dict[str, Any]) -> dict[str, Curve]:
    return {corpus: Curve.parse(c) for corpus, c in data.items()}


@dataclass(frozen=True)
class PositionCurves:
    """Per-position log-PPL per corpus (and attention entropy of the primary corpus) of the tiled windows:
    over the equal-width buckets ``edges`` (the curves) and over the ``octaves`` [0, L), [L, 2L), ... of the
    training length L (the "past L" figures)."""

    edges: list[int]
    octaves: list[tuple[int, int]]
    logppl: dict[str, Curve]
    octave_logppl: dict[str, Curve]
    entropy: Curve | None = None
    octave_entropy: Curve | None = None

    @property
    def primary(self) -> Curve:
        """The primary (first) corpus's octave log-PPL curve."""
        return next(iter(self.octave_logppl.values()))

    def body(self) -> dict[str, Any]:
        out = {"edges": self.edges, "octaves": self.octaves,
               "logppl": {c: v.body() for c, v in self.logppl.items()},
               "octave_logppl": {c: v.body() for c, v in self.octave_logppl.items()}}
        if self.entropy is not None:
            out["entropy"] = self.entropy.body()
        if self.octave_entropy is not None:
            out["octave_entropy"] = self.octave_entropy.body()
        return out

    @classmethod
    def parse(cls, data: dict[str, Any]) -> PositionCurves:
        return cls(data.get("edges", []), [tuple(o) for o in data["octaves"]], _curves(data.get("logppl", {})),
                   _curves(data["octave_logppl"]),
                   Curve.parse(data["entropy"]) if "entropy" in data else None,
                   Curve.parse(data["octave_entropy"]) if "octave_entropy" in data else None)


@dataclass(frozen=True)
class HeadEntropy:
    """Attention entropy (``unit``: nats) per (layer, head, position bucket ``edges``): ``per_head`` (n_layer,
    n_head, buckets) and its mean over heads per bucket (Fig 3)."""

    edges: list[int]
    unit: str
    per_head: list
    mean: list[float]

    def body(self) -> dict[str, Any]:
        return {"edges": self.edges, "unit": self.unit, "per_head": self.per_head, "mean": self.mean}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> HeadEntropy:
        return cls(data["edges"], data["unit"], data["per_head"], data["mean"])


@dataclass(frozen=True)
class EvaluationResult(ResultFile):
    """One ``evaluate`` run: the setting (``extension_label``), training length L, split, evaluation lengths,
    stride, corpora (the first is the primary one) and bootstrap resamples, the per-head temperatures when
    they differ between heads ((n_layer, n_head), units of 1/sqrt(d)), the length (tokens) the applied per-head
    table was tuned at (``tuning_len``: HeadScale's ``target_len``; None without a tuned table, and in files
    written before it was recorded), and the sections that ran:
    perplexity per corpus and length with its per-window rows, per-position curves, attention entropy (per
    head, and the mean over positions [0, n) per length n), passkey retrieval, long-context task scores per
    task and length (0-1; ``longctx_skipped``: task/length -> why), LongBench and harness metrics."""

    KIND = "evaluate"

    train_len: int
    corpora: list[str]
    setting: str = ""
    split: str = "test"
    lengths: list[int] = field(default_factory=list)
    stride: int = 0
    bootstrap: int = 0
    temperature_table: list | None = None
    ppl: dict[str, dict[int, Perplexity]] | None = None
    windows: dict[str, ScoredWindows] | None = None
    position: PositionCurves | None = None
    entropy: HeadEntropy | None = None
    entropy_by_length: dict[int, float] | None = None
    passkey: PasskeyResults | None = None
    longctx: dict[str, dict[int, float]] | None = None
    longctx_skipped: dict[str, str] | None = None
    longbench: dict[str, float] | None = None
    harness: dict[str, float] | None = None
    tuning_len: int | None = None

    def perplexity(self, corpus: str, length: int) -> Perplexity | None:
        """The perplexity of ``corpus`` at ``length`` tokens, None when not measured."""
        return (self.ppl or {}).get(corpus, {}).get(length)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"setting": self.setting, "train_len": self.train_len, "split": self.split,
                               "lengths": self.lengths, "stride": self.stride, "corpora": self.corpora,
                               "bootstrap": self.bootstrap}
        sections = {
            "temperature_table": self.temperature_table, "tuning_len": self.tuning_len,
            "ppl": None if self.ppl is None else {c: {n: p.body() for n, p in by_length.items()}
                                                  for c, by_length in self.ppl.items()},
            "windows": None if self.windows is None else {c: w.body() for c, w in self.windows.items()},
            "position": None if self.position is None else self.position.body(),
            "entropy": None if self.entropy is None else self.entropy.body(),
            "entropy_by_length": self.entropy_by_length,
            "passkey": None if self.passkey is None else self.passkey.body(),
            "longctx": self.longctx, "longctx_skipped": self.longctx_skipped, "longbench": self.longbench,
            "harness": self.harness}
        return {**out, **{k: v for k, v in sections.items() if v is not None}}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> EvaluationResult:
        def section(key: str, read):
            return read(data[key]) if key in data else None

        return cls(
            data["train_len"], data["corpora"], data.get("setting", ""), data.get("split", "test"),
            data.get("lengths", []), data.get("stride", 0), data.get("bootstrap", 0), data.get("temperature_table"),
            section("ppl", lambda s: {c: {int(n): Perplexity.parse(p) for n, p in by_length.items()}
                                      for c, by_length in s.items()}),
            section("windows", lambda s: {c: ScoredWindows.parse(w) for c, w in s.items()}),
            section("position", PositionCurves.parse), section("entropy", HeadEntropy.parse),
            section("entropy_by_length", int_keys), section("passkey", PasskeyResults.parse),
            section("longctx", lambda s: {task: int_keys(scores) for task, scores in s.items()}),
            data.get("longctx_skipped"), data.get("longbench"), data.get("harness"), data.get("tuning_len"))
