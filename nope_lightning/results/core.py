"""What every result file shares: a JSON form with a format ``version``, written and read in one place.

A result type subclasses ``ResultFile``: ``body()`` gives its on-disk form, ``parse(data)`` reads it back.
``to_dict`` / ``save`` add ``version``; ``from_dict`` / ``load`` check it. A file without ``version`` was
written before results were versioned (the committed reports were made from such files) and has version 1's
layout; a newer version than this code knows fails with one line, rather than misreading a changed layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Self


class ResultFile:
    """A stage's result with its on-disk JSON form (``KIND`` names it in errors, ``VERSION`` is its layout)."""

    KIND: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def body(self) -> dict[str, Any]:
        """The on-disk form without ``version``."""
        raise NotImplementedError

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Self:
        """The result from its on-disk form (any version up to ``VERSION``)."""
        raise NotImplementedError

    def label(self) -> tuple[tuple[str, str], ...]:
        """What the result holds that its run key may not name, as ``(key, value)`` pairs like a matrix point; a
        bundle adds the pairs its key's point lacks to the result's file name. Empty by default."""
        return ()

    def to_dict(self) -> dict[str, Any]:
        """The on-disk form (JSON-ready up to ``dumps``: int keys and tuples become strings and lists)."""
        return {"version": self.VERSION, **self.body()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> Self:
        """The result from its on-disk form; ``source`` names the file in the one-line error."""
        version = data.get("version", 1)
        if not isinstance(version, int) or version > cls.VERSION:
            where = f"{source} is " if source else "this is "
            raise ValueError(f"{where}a {cls.KIND} result of format version {version}, newer than this "
                             f"nope-lightning reads ({cls.VERSION}); upgrade nope-lightning to read it")
        return cls.parse(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Self:
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))


def dumps(data: dict[str, Any]) -> str:
    """A result's JSON text, as ``tracking.log_json`` writes it (``default=str`` for stray numpy scalars)."""
    return json.dumps(data, indent=1, default=str)


def int_keys(mapping: dict[str, Any]) -> dict[int, Any]:
    """A mapping whose keys JSON turned into strings (lengths), with int keys again, in order."""
    return {int(k): v for k, v in mapping.items()}
