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
    on the order its sources are listed in (or, within one source, on which run of a step came last). A seed is
    an ``int`` (or ``None``: no replicates), never the text of a tag."""

    def __init__(self) -> None:
        self._held: dict[RunKey, tuple[str, ResultFile]] = {}

    def add(self, key: RunKey, result: ResultFile, source: str) -> RunKey:
        """File ``result`` at ``key``'s place (its ``step`` dropped) from ``source``; returns the place."""
        if key.seed is not None and (isinstance(key.seed, bool) or not isinstance(key.seed, int)):
            raise TypeError(f"{key.stage} {key.method!r}: seed {key.seed!r} is a {type(key.seed).__name__}, "
                            f"not an int; read it through RunKey.from_tags")
        place = dataclasses.replace(key, step="")
        if (held := self._held.get(place)) is not None:
            raise ValueError(f"{held[0]} and {source} both hold {key.stage} {key.method!r} seed {key.seed}: "
                             f"report each alone, or drop one from also")
        self._held[place] = (source, result)
        return place

    def __iter__(self) -> Iterator[RunKey]:
        """The places, in the order filed."""
        return iter(self._held)

    def stage(self, stage: str) -> dict[Point, dict[str, dict[int | None, ResultFile]]]:
        """``point -> method -> seed -> result`` of one stage ({} when it has none)."""
        view: dict[Point, dict[str, dict[int | None, ResultFile]]] = {}
        for key, (_, result) in self._held.items():
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
