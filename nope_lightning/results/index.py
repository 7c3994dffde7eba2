"""A study's results in one index keyed by ``RunKey``: the place of a result in a study is its stage, matrix point,
method and seed (the step that ran it is not part of it: two steps filing one method at one place are one
result twice).

The report reads every stage's results through the views here (``at``: one point's ``method -> seed -> result``,
``stage``: every point's), plain dicts in the order the results were added: the first result added at a point
puts the point first, the first of a method at a point puts the method first. A report's tables, sections and
figures follow that order, so the same sources give the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from nope_lightning.results.core import ResultFile
from nope_lightning.results.runkey import RunKey

#: A matrix point: ``((key, value), ...)``, ``()`` without a matrix.
Point = tuple[tuple[str, str], ...]


class ResultIndex:
    """Results keyed by ``RunKey(method, seed, point, stage)``, each with the ``source`` (a label, e.g.
    ``results bundle experiments/x/results/results``) it came from.

    A second result at a place is a ``ValueError`` naming both sources: which one a report shows must not depend
    on the order its sources are listed in (or, within one source, on which run of a step came last). The one
    exception is the same result from a second source (its ``identity``, ``sources.result_digest``, known for both
    and equal), e.g. a pipeline run and the bundle a report wrote from it: the first stays and the second is
    counted in ``remeasured``. A step measured again (another machine, another torch) differs, in its last digits
    or more, so it still stops the report: which of two measurements a table shows is the user's choice. A seed is an
    ``int`` (or ``None``: no replicates), never the text of a tag."""

    def __init__(self) -> None:
        self._held: dict[RunKey, tuple[str, ResultFile, str]] = {}
        #: ``(place, the source kept, the source not counted)`` of every result read twice, in the order met.
        self.remeasured: list[tuple[RunKey, str, str]] = []

    def add(self, key: RunKey, result: ResultFile, source: str, identity: str = "") -> RunKey | None:
        """File ``result`` at ``key``'s place (its ``step`` dropped) from ``source``; returns the place, or None
        when it is the result held there read again (``identity``: its content's digest, ``sources.result_digest``;
        '' unknown)."""
        if key.seed is not None and (isinstance(key.seed, bool) or not isinstance(key.seed, int)):
            raise TypeError(f"{key.stage} {key.method!r}: seed {key.seed!r} is a {type(key.seed).__name__}, "
                            f"not an int; read it through RunKey.from_tags")
        place = dataclasses.replace(key, step="")
        if (held := self._held.get(place)) is not None:
            if identity and held[2] == identity and held[0] != source:  # one source's two runs still stop it
                self.remeasured.append((place, held[0], source))
                return None
            raise ValueError(f"{held[0]} and {source} both hold {key.stage} {key.method!r} seed {key.seed}"
                             f"{' with different results' if identity and held[2] else ''}: "
                             f"report each alone, or drop one from also")
        self._held[place] = (source, result, identity)
        return place

    def remeasured_line(self) -> str:
        """'N rows read twice, counted once: ...' (each ``stage method seed s``, the source kept first), '' with none."""
        if not self.remeasured:
            return ""
        rows = "; ".join(f"{p.stage} `{p.method}`{'' if p.seed is None else f' seed {p.seed}'}"
                         f"{''.join(f' {k}={v}' for k, v in p.point)} ({kept} kept over {dropped})"
                         for p, kept, dropped in self.remeasured)
        return (f"{len(self.remeasured)} row{'s' * (len(self.remeasured) > 1)} read twice, counted once (the same "
                f"result in two sources): {rows}.")

    def __iter__(self) -> Iterator[RunKey]:
        """The places, in the order filed."""
        return iter(self._held)

    def stage(self, stage: str) -> dict[Point, dict[str, dict[int | None, ResultFile]]]:
        """``point -> method -> seed -> result`` of one stage ({} when it has none)."""
        view: dict[Point, dict[str, dict[int | None, ResultFile]]] = {}
        for key, (_, result, _) in self._held.items():
            if key.stage == stage:
                view.setdefault(key.point, {}).setdefault(key.method, {})[key.seed] = result
        return view

    def at(self, stage: str, point: Point) -> dict[str, dict[int | None, ResultFile]]:
        """``method -> seed -> result`` of one stage at one matrix point ({} when it has none there)."""
        return self.stage(stage).get(point, {})

    def points(self, *stages: str) -> list[Point]:
        """The matrix points any of ``stages`` has a result at, in the order first filed."""
        return list(dict.fromkeys(key.point for key in self._held if key.stage in stages))

    def results(self, stage: str) -> list[ResultFile]:
        """One stage's results, point by point, method by method (the order of ``stage``)."""
        return [result for by_method in self.stage(stage).values() for by_seed in by_method.values()
                for result in by_seed.values()]
