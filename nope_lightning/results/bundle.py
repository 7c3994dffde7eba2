"""A report's results as files beside its ``report.md`` (``<out_dir>/results/``), made to be committed with it.

A study's seeds may run on different machines or days, and a store (``mlruns/``) does not outlive the machine it
was written on. The bundle keeps what a report read: every result (through its type, gzipped JSON) with the
run identity that places it (``RunKey`` tags), the experiment files that named the methods and claims, the
pre-training recipe rows, and the figures and notes runs made themselves (HeadScale's Fig 5, synthetic
accuracy). A later report reads the folder in place of a store (``also=[{results: <folder>}]``), so seeds run
apart are reported together from what is committed, and the report can be regenerated from a fresh clone.

Layout (``VERSION`` 1)::

    index.json                  pipelines, configs, results (file, run name, tags), pretrains, files,
                                ``dates`` (pipeline run id -> the day it ran, ISO, UTC; absent in older bundles)
                                and ``machines`` (pipeline run id -> its ``nope_lightning.machine`` tag: every
                                machine that ran it; absent where no run recorded one)
    pipeline-<run id>.yaml      each pipeline run's experiment file, as it logged it
    <stage>/<method>-s<seed>[-<point>][-<label>].json.gz   (label: what the result holds, e.g. taskparity,
                                                         penope_t5 for a slice of two PEs)
    files/<name>                figures and notes copied from runs (``<method>-<name>`` in the report)

Results are written with gzip's ``mtime=0``, so a report rewritten from the same runs leaves the same bytes.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nope_lightning.results.core import ResultFile, dumps
from nope_lightning.results.evaluation import EvaluationResult
from nope_lightning.results.headscale import HeadScaleResult
from nope_lightning.results.runkey import RunKey
from nope_lightning.results.search import ScaleSearchResult
from nope_lightning.results.synthetic import SyntheticGridResult

VERSION = 1
INDEX = "index.json"
#: The result each gathered stage logs: ``stage -> (its artifact file in a run, its type)``.
STAGE_RESULTS: dict[str, tuple[str, type[ResultFile]]] = {
    "evaluate": ("results.json", EvaluationResult), "scale-search": ("scale_search.json", ScaleSearchResult),
    "headscale": ("headscale.json", HeadScaleResult), "synthetic-grid": ("results.json", SyntheticGridResult)}


@dataclass
class Placed:
    """One run's result at its place in a study: ``key`` (method, seed, point, stage), the run's ``name``."""

    key: RunKey
    name: str
    result: ResultFile


@dataclass
class Recipe:
    """A pre-training run behind the figures: its run ``name`` and the settings the recipe table prints."""

    name: str
    params: dict[str, str]


@dataclass
class Bundle:
    """What a report read. ``pipelines``: ``(name, run id)`` of every pipeline run behind it; ``configs``: the
    experiment file each logged (``None`` where it logged none), in the same order; ``dates``: pipeline run id ->
    the day it ran (ISO, UTC), where known (a report lists the claim rules changed after it); ``machines``:
    pipeline run id -> the machines that ran it, where recorded (runs made before the tag have none)."""

    pipelines: list[tuple[str, str]]
    configs: list[Path | None]
    results: list[Placed] = field(default_factory=list)
    pretrains: list[Recipe] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    dates: dict[str, str] = field(default_factory=dict)
    machines: dict[str, str] = field(default_factory=dict)

    def write(self, folder: str | Path) -> Path:
        """Write the bundle into ``folder`` (emptied first: a bundle is exactly one report's results). What it
        copies is read first, so a report regenerated in place from its own bundle rewrites the same folder."""
        folder = Path(folder)
        configs = [None if config is None else (f"pipeline-{run}.yaml", Path(config).read_bytes())
                   for (_, run), config in zip(self.pipelines, self.configs, strict=True)]
        files = [(path.name, Path(path).read_bytes()) for path in self.files]
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for config in configs:
            if config is not None:
                (folder / config[0]).write_bytes(config[1])
        entries, taken = [], set()
        for placed in self.results:
            name = _unique(f"{placed.key.stage}/{_slug(placed.key, placed.result.label())}", taken)
            (folder / name).parent.mkdir(exist_ok=True)
            (folder / name).write_bytes(gzip.compress(dumps(placed.result.to_dict()).encode(), mtime=0))
            entries.append({"file": name, "run_name": placed.name, "tags": placed.key.tags()})
        if files:
            (folder / "files").mkdir()
        for name, data in files:
            (folder / "files" / name).write_bytes(data)
        index = {"version": VERSION, "pipelines": [list(p) for p in self.pipelines], "configs": [c and c[0] for c in configs],
                 "results": entries, "pretrains": [{"name": r.name, "params": r.params} for r in self.pretrains],
                 "files": [name for name, _ in files], **({"dates": self.dates} if self.dates else {}),
                 **({"machines": self.machines} if self.machines else {})}
        (folder / INDEX).write_text(json.dumps(index, indent=1) + "\n")
        return folder

    @classmethod
    def read(cls, folder: str | Path) -> Bundle:
        """The bundle a report wrote into ``folder``; a missing, newer or damaged one fails in one line."""
        folder = Path(folder)
        index_path = folder / INDEX
        if not index_path.is_file():
            raise FileNotFoundError(f"{folder} holds no {INDEX}: point also=[{{results: ...}}] at the results/ "
                                    f"folder a report wrote (e.g. experiments/<study>/results/results)")
        try:
            index = json.loads(index_path.read_text())
            version = index.get("version")
            if not isinstance(version, int) or version > VERSION:
                raise ValueError(f"{folder} is a results bundle of format version {version}, newer than this "
                                 f"nope-lightning reads ({VERSION}); upgrade nope-lightning to read it")
            results = [load_entry(folder, entry) for entry in index["results"]]
            return cls(pipelines=[(name, run) for name, run in index["pipelines"]],
                       configs=[None if c is None else folder / c for c in index["configs"]], results=results,
                       pretrains=[Recipe(r["name"], dict(r["params"])) for r in index["pretrains"]],
                       files=[folder / "files" / name for name in index["files"]], dates=dict(index.get("dates", {})),
                       machines=dict(index.get("machines", {})))
        except (KeyError, TypeError, OSError, EOFError, json.JSONDecodeError, gzip.BadGzipFile) as error:
            raise ValueError(f"{folder}: damaged results bundle ({type(error).__name__}: {error}); restore it "
                             f"from git (git checkout -- {folder}) or rerun the report that wrote it") from error


def load_entry(folder: Path, entry: dict[str, Any]) -> Placed:
    """One result of the bundle in ``folder``: ``entry`` is its row of the index's ``results``."""
    key = RunKey.from_tags(entry["tags"], entry["run_name"])
    if key.stage not in STAGE_RESULTS:
        raise KeyError(f"stage {key.stage!r} of {entry['file']}")
    kind = STAGE_RESULTS[key.stage][1]
    path = folder / entry["file"]
    return Placed(key, entry["run_name"], kind.from_dict(json.loads(gzip.decompress(path.read_bytes())), str(path)))


def _slug(key: RunKey, label: tuple[tuple[str, str], ...] = ()) -> str:
    """``nope_lambda_1.5-s1234[-n_layer2]``: the method, seed and matrix point, then the result's ``label`` pairs
    the point lacks (``grid-s3-taskparity``), safe as a file name. Named by what it holds, a result keeps its file
    name when a later report adds runs beside it; only results alike in all of these are numbered."""
    named = dict(key.point)
    point = [*key.point, *((k, v) for k, v in label if k not in named)]
    parts = [key.method, *([f"s{key.seed}"] if key.seed is not None else []), *(f"{k}{v}" for k, v in point)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def _unique(stem: str, taken: set[str]) -> str:
    """``stem.json.gz``, numbered when two methods' labels slug to the same name."""
    name, n = f"{stem}.json.gz", 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}.json.gz"
    taken.add(name)
    return name
