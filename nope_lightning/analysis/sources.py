"""Where a report's results come from: pipeline runs in an MLflow store, or results bundles (``results/bundle.py``)
that earlier reports wrote and a study committed. Both give the same things — the runs' results placed by their
``RunKey``, the experiment files, the pre-training recipes, the figures runs made themselves — so the report
neither knows nor cares whether a seed was run here today or committed from another machine last week.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from nope_lightning.analysis.report_frame import RECIPE_KEYS
from nope_lightning.config import paper
from nope_lightning.config.core import load_config
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.pipeline import PipelineConfig, ReportConfig
from nope_lightning.results.bundle import STAGE_RESULTS, Bundle, Placed, Recipe
from nope_lightning.results.core import ResultFile, dumps
from nope_lightning.results.index import ResultIndex
from nope_lightning.results.runkey import RunKey
from nope_lightning.runtime import tracking


@dataclass
class Item:
    """One run of a source: its ``key``, run ``name`` and ``identity`` (one model placed at several points is
    one recipe row), its ``result`` (gathered stages), its ``recipe`` (pre-training), ``copy``, which brings
    the figures and notes the run made itself into a folder and returns their paths, and ``step``: its result's
    content (``result_digest``; '' without a result)."""

    key: RunKey
    name: str
    identity: str
    result: ResultFile | None = None
    recipe: Recipe | None = None
    copy: Callable[[Path], list[Path]] = lambda out: []
    step: str = ""


def result_digest(result: ResultFile | None) -> str:
    """A result's content as 16 hex of sha256 ('' without one): two sources holding the same row (a pipeline run
    and the bundle a report wrote from it, or a bundle read twice) hold equal digests. Only content is compared,
    not the step that made it: the step's identity lives in the pipeline layer, above this one."""
    return "" if result is None else hashlib.sha256(dumps(result.to_dict()).encode()).hexdigest()[:16]


def pipeline_runs(store: TrackingConfig, pipeline_run: str) -> list[tuple[Any, RunKey]]:
    """The runs behind a pipeline's figures with their places, oldest first: one per step record — the run the
    step started, or the one it reused (a finished step of another pipeline run found by its hash, a model found
    by name, such as ``small``'s for ``small_temperature``), placed where this pipeline's record says — and the
    direct children no record names (a step killed mid-way), placed by their own tags."""
    client = tracking.client(store)
    parent = client.get_run(pipeline_run)
    children = {run.info.run_id: run for run in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{pipeline_run}'",
        order_by=["attributes.start_time ASC"], max_results=5000)}
    placed = []
    for record in tracking.step_records(store, pipeline_run).values():
        if run_id := record["result"].get("run_id"):
            run = children.get(run_id) or client.get_run(run_id)
            # A record written before records held their tags: the run's own tags place it.
            placed.append((run, RunKey.from_tags(record.get("tags") or run.data.tags, run.info.run_name)))
    recorded = {run.info.run_id for run, _ in placed}
    placed += [(run, RunKey.from_tags(run.data.tags, run.info.run_name)) for run_id, run in children.items()
               if run_id not in recorded]
    return sorted(placed, key=lambda pair: pair[0].info.start_time)


@dataclass
class StoreSource:
    """A pipeline run ``run`` in the MLflow store ``store``."""

    store: TrackingConfig
    run: str
    steps: frozenset[str] = frozenset()  # read only these step ids' results (empty: all)

    @property
    def label(self) -> str:
        return f"pipeline run {self.run}"

    @property
    def origin(self) -> str:
        """Where its pipeline run was read, for the report's provenance."""
        return f"MLflow store {self.store.uri}"

    @cached_property
    def pipeline_run(self) -> Any:
        """The pipeline run (an MLflow ``Run``), read once for its name, day and machines."""
        return tracking.client(self.store).get_run(self.run)

    def pipelines(self) -> list[tuple[str, str]]:
        return [(self.pipeline_run.info.run_name, self.run)]

    def dates(self) -> dict[str, str]:
        """The pipeline run's start day (ISO, UTC)."""
        start = self.pipeline_run.info.start_time
        return {self.run: datetime.fromtimestamp(start / 1000, UTC).date().isoformat()}

    def machines(self) -> dict[str, str]:
        """The machines that ran the pipeline run (its ``tracking.MACHINE_TAG``), none for a run made before it."""
        tag = self.pipeline_run.data.tags.get(tracking.MACHINE_TAG)
        return {self.run: tag} if tag else {}

    def configs(self) -> list[Path | None]:
        """The experiment file the pipeline run logged (``config.yaml``), None when it logged none."""
        names = {a.path for a in tracking.client(self.store).list_artifacts(self.run)}
        return [tracking.download(self.store, self.run, "config.yaml") if "config.yaml" in names else None]

    def items(self) -> Iterator[Item]:
        for run, key in pipeline_runs(self.store, self.run):
            run_id, result, recipe = run.info.run_id, None, None
            if key.stage in STAGE_RESULTS:
                path, kind = STAGE_RESULTS[key.stage]
                if path in {a.path for a in tracking.client(self.store).list_artifacts(run_id)}:
                    result = kind.load(tracking.download(self.store, run_id, path))
            elif key.stage == "pretrain":
                recipe = Recipe(run.info.run_name, {k: run.data.params.get(k, "None") for k in RECIPE_KEYS})
            yield Item(key, run.info.run_name, run_id, result, recipe,
                       lambda out, run=run, key=key: _copy_run_files(self.store, run, out, key.method),
                       result_digest(result))


@dataclass
class BundleSource:
    """A results bundle a report wrote (``<out_dir>/results``), e.g. committed under ``experiments/<study>/results/results``."""

    folder: Path
    steps: frozenset[str] = frozenset()  # read only these step ids' results (empty: all)
    bundle: Bundle = field(init=False)

    def __post_init__(self) -> None:
        self.bundle = Bundle.read(self.folder)

    @property
    def label(self) -> str:
        return f"results bundle {self.folder}"

    @property
    def origin(self) -> str:
        return self.label

    def pipelines(self) -> list[tuple[str, str]]:
        return list(self.bundle.pipelines)

    def dates(self) -> dict[str, str]:
        return dict(self.bundle.dates)

    def machines(self) -> dict[str, str]:
        return dict(self.bundle.machines)

    def configs(self) -> list[Path | None]:
        return list(self.bundle.configs)

    def items(self) -> Iterator[Item]:
        # The bundle's figures were the first seed's when it was written: they come with its first result.
        files = list(self.bundle.files)
        for n, placed in enumerate(self.bundle.results):
            yield Item(placed.key, placed.name, f"{self.folder}:{placed.name}", placed.result,
                       copy=(lambda out: _copy_files(files, out)) if n == 0 else (lambda out: []),
                       step=result_digest(placed.result))
        for recipe in self.bundle.pretrains:
            yield Item(RunKey(recipe.name, stage="pretrain"), recipe.name, f"{self.folder}:{recipe.name}",
                       recipe=recipe)


@dataclass(frozen=True)
class Methods:
    """What experiment files say of their methods (step labels) for the report: the ``reference`` every method
    is paired against ('': none) and the ``more_references`` each with a paired table of its own, the paper row
    each method is printed beside (``rows[table][method]``, ``table`` a key of ``paper.ROWS``), and the NoPE
    family (drawn apart from the baselines)."""

    reference: str = ""
    rows: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    nope_family: frozenset[str] = frozenset()
    more_references: tuple[str, ...] = ()

    @classmethod
    def of(cls, *pipelines: PipelineConfig | None) -> Methods:
        """The files' own (their steps' ``paper`` and ``family``; the references of the first file): a report over
        several pipeline runs (a study split into files) knows every file's methods; none without a file."""
        files = [p for p in pipelines if p is not None]
        if not files:
            return cls()
        steps = {step.label or step.id: step for pipeline in files for step in pipeline.steps}
        rows = {table: {m: step.paper[table] for m, step in steps.items() if table in step.paper}
                for table in paper.ROWS}
        return cls(files[0].reference, rows, frozenset(m for m, step in steps.items() if step.family == "nope"),
                   tuple(files[0].more_references))

    @property
    def references(self) -> tuple[str, ...]:
        """Every method a paired table compares with, the reference first."""
        return tuple(m for m in (self.reference, *self.more_references) if m)

    def paper_rows(self, table: str) -> Mapping[str, str]:
        """method -> its row of the paper's ``table``."""
        return self.rows.get(table, {})


def open_sources(cfg: ReportConfig) -> list[StoreSource | BundleSource]:
    """``cfg.run`` (when given) and every ``also`` entry, in order, each with its ``steps`` filter."""
    return [BundleSource(s, steps) if isinstance(s, Path) else StoreSource(*s, steps)
            for s, steps in zip(cfg.sources, cfg.step_filters, strict=True)]


def reading_line(cfg: ReportConfig, sources: list[StoreSource | BundleSource]) -> str:
    """What the report chose to read, for its provenance: the experiment file whose claims it judged
    (``claims_from``) and the sources read for named steps only ('' when neither)."""
    said = [f"The claims judged are those `{cfg.claims_from}` lists (as read when this report was made), with "
            "every source file's own."] if cfg.claims_from else []
    said += [f"From the {s.label}, only the steps {', '.join(f'`{step}`' for step in sorted(s.steps))}."
             for s in sources if s.steps]
    return " ".join(said)


def pipeline_settings(cfg: ReportConfig, configs: list[Path | None]) -> tuple[list[str], dict[str, str], int,
                                                                          list[str], Methods]:
    """``(claims, sweep, bootstrap, matrix keys, methods)``: this config's, else the first pipeline's logged
    config's (``configs``: every source's experiment files, in order; the claims: ``cfg.claims_from``'s, when
    given); what the files say of their methods always comes from all of them."""
    logged = [load_config(PipelineConfig, path) if path else None for path in configs]
    first = logged[0]
    declaring = load_config(PipelineConfig, cfg.claims_from) if cfg.claims_from else first
    claim_ids = cfg.claims if cfg.claims is not None else (declaring.claims if declaring else [])
    axes = cfg.sweep if cfg.sweep is not None else (first.sweep if first else {})
    resamples = cfg.bootstrap or (first.bootstrap if first else 1000)
    return claim_ids, axes, resamples, list(first.matrix) if first else [], Methods.of(*logged)


def seed_days(configs: list[Path | None], run_ids: list[str], dates: Mapping[str, str]) -> dict[int | None, str]:
    """Seed -> the day (ISO, UTC) its pipeline run started, from each pipeline's logged experiment file
    (``configs``, in the order of ``run_ids``); a seed two runs share gets the earlier day; a file without seeds
    runs seed None. The earliest of the seed's rows' days (``row_days``), so each file is read once."""
    days: dict[int | None, str] = {}
    for (_, seed), day in row_days(configs, run_ids, dates).items():
        days[seed] = min(days.get(seed, day), day)
    return days


def row_days(configs: list[Path | None], run_ids: list[str], dates: Mapping[str, str]
             ) -> dict[tuple[str, int | None], str]:
    """``(method, seed) -> the day (ISO, UTC)`` the pipeline run that made that method's row for that seed started:
    the earliest of the runs whose logged experiment file (``configs``, in the order of ``run_ids``) runs a step of
    that method (its label, else its id) at that seed, whichever stage. A row a file added to an old seed later (a
    new step run after the seed's first pipeline) is so dated by its own run, where ``seed_days`` gives the seed's
    first. A run that reused a step another pipeline run made lists it too, and that run's earlier day wins."""
    days: dict[tuple[str, int | None], str] = {}
    for path, run_id in zip(configs, run_ids, strict=False):
        if path is None or run_id not in dates:
            continue
        cfg = load_config(PipelineConfig, path)
        for seed in cfg.seeds or [None]:
            for step in cfg.steps:
                place = (step.label or step.id, seed)
                days[place] = min(days.get(place, dates[run_id]), dates[run_id])
    return days


@dataclass
class Gathered:
    """Every source's results: ``results``, evaluate, scale-search, HeadScale and synthetic-grid results placed
    by stage, matrix point (the run's matrix values ``((key, value), ...)``, ``()`` without a matrix), method and
    seed; the pre-training ``recipes``; and, for the report's bundle, everything ``placed`` and the run-made
    ``files`` copied into the report's folder, all of them the runs' at ``first_seed``."""

    results: ResultIndex = field(default_factory=ResultIndex)
    recipes: list[Recipe] = field(default_factory=list)
    placed: list[Placed] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    first_seed: int | None = None


def gather(sources: list, out: Path, matrix_keys: list[str]) -> Gathered:
    """Every source's runs, placed (a source's ``steps``, when given, keeps only those steps' runs; one it names
    that the source never ran is a ``ValueError``). A (stage, point, method, seed) that two sources both hold is a
    ``ValueError`` (``ResultIndex.add``): which one the report shows must not depend on the order of ``also``;
    unless both hold the same result (``result_digest``: a run and the bundle written from it), kept once and
    counted (``ResultIndex.remeasured``)."""
    found = Gathered()
    first_seed, identities = None, set()
    for source in sources:
        kept = set()
        for item in source.items():
            key = item.key
            if source.steps and key.step not in source.steps:
                continue
            kept.add(key.step)
            first_seed = key.seed if first_seed is None else first_seed
            values = dict(key.point)
            # A grid keeps its whole point: grids are pooled over points, and the first file's matrix keys need
            # not name all of another file's (a scratchpad study's (task, scratchpad) beside a task study's task).
            point = (tuple((k, values[k]) for k in matrix_keys if k in values)
                     if matrix_keys and key.stage != "synthetic-grid" else key.point)
            if key.stage == "synthetic-grid" and item.result is not None:
                # A grid's place also names the cells it holds: a study of one file a task runs every task's grid
                # at the same (point, step, seed), and two grids of different tasks, or of one task's PEs split in
                # slices, are not one result twice (a cell that two grids both hold stops ``CellIndex``).
                point = (*point, ("cells", ",".join(sorted({f"{c.task}/{c.scratchpad}/{c.pos_encoding}"
                                                            for c in item.result.runs}))))
            if item.result is not None:
                if found.results.add(dataclasses.replace(key, point=point), item.result, source.label,
                                     item.step) is None:
                    continue  # the same result held twice: the first source's stays, its figures too
                found.placed.append(Placed(key, item.name, item.result))
            elif item.recipe is not None and item.identity not in identities and item.recipe not in found.recipes:
                # once, though steps at several points share one model, or a later source trained it again alike
                identities.add(item.identity)
                found.recipes.append(item.recipe)
            if key.seed == first_seed:  # their own figures (Fig 5, synthetic accuracy) from the first replicate
                found.files += item.copy(out)
        if missing := sorted(source.steps - kept):
            raise ValueError(f"also: {source.label} holds no result of step(s) {', '.join(missing)}: name the step "
                             "ids of its experiment file that ran (its `steps:` ids), or drop steps= to read it all")
    found.first_seed = first_seed
    return found


def _copy_files(files: list[Path], out: Path) -> list[Path]:
    """A bundle's run-made files into ``out``, as the report shows them; a file already there stays (an earlier
    source's, or this bundle's own when a report is regenerated in place)."""
    for path in files:
        if not (out / path.name).exists():
            shutil.copyfile(path, out / path.name)
    return [out / path.name for path in files]


def run_file_name(method: str, name: str) -> str:
    """The report's name for a file a run of ``method`` made: ``<method>-<name>``, spaces made underscores."""
    return f"{method.replace(' ', '_')}-{name}"


def _copy_run_files(store: TrackingConfig, run, out: Path, method: str) -> list[Path]:
    """The PNGs and notes that HeadScale and synthetic runs made themselves (Fig 5, per-length accuracy), as
    ``<method>-<name>`` in ``out``. Not a grid's: the report draws its figures over every grid it reads
    (``synthetic_figures``)."""
    if run.data.tags.get("stage") not in ("headscale", "synthetic"):
        return []
    client, copied = tracking.client(store), []
    for folder in (None, "plots", "headscale"):
        for artifact in client.list_artifacts(run.info.run_id, folder):
            if artifact.path.endswith((".png", ".md")):
                local = tracking.download(store, run.info.run_id, artifact.path)
                copied.append(out / run_file_name(method, Path(artifact.path).name))
                shutil.copyfile(local, copied[-1])
    return copied
