"""The pipeline and report configs: an experiment file's schema (steps, seeds, matrix, claims, sweep)."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from nope_lightning.config.core import check_bootstrap
from nope_lightning.config.paper import CLAIMS_BY_ID, PRECONDITION_NEEDS, TEST_NEEDS, Claim, row_problem
from nope_lightning.config.parts import TrackingConfig

#: The report's method families: ``nope`` is NoPE and its temperature repairs (drawn together in the report's
#: NoPE figure; every other method is drawn in the baselines figure, beside the reference).
FAMILIES = ("nope",)
#: The methods the sweep's measures compare (``sweep.MEASURES``), by role: NoPE, RoPE, NoPE's scale search,
#: and NoPE at the best uniform temperature for 2x. A sweep names the step label of each role it measures.
SWEEP_ROLES = ("nope", "rope", "search", "repaired")


@dataclass
class TemperatureInput:
    """Where a step's attention temperatures come from, by step id (``PipelineStep.temperature``): ``search``, a
    scale-search step whose best uniform lambda at ``at`` tokens (one of its ``target_lengths``) an evaluation or
    export applies (``extension.temperature.uniform_search`` + ``_len``), and a HeadScale step starts from (its
    ``scale_search``, read at its own ``target_len``: no ``at``); ``fit``, a scale-search step whose fit a of
    lambda = 1 + a ln s gives the log slopes (``extension.temperature.log_slope_fit``); ``headscale``, a HeadScale
    step whose learned table is applied: lambda, lambda past L or log slopes, by that step's ``parameterization``
    (``extension.temperature.table`` or ``log_slope_table``, ``runs:/<its run>/<its table file>``)."""

    search: str = ""
    at: int = 0
    fit: str = ""
    headscale: str = ""


@dataclass
class PipelineStep:
    """One stage of a pipeline. Its inputs name earlier steps by id: ``model``, the step whose model it reads (a
    pretrain or finetune step's logged export, ``runs:/<run id>/model``, or an import step's export folder: the
    stage's ``checkpoint``), and ``temperature`` (``TemperatureInput``: ``{search: search_nope, at: 512}``,
    ``{headscale: headscale_4x}``, ``{fit: search_nope}``), each that step's result at the same seed and matrix
    point, handed to the stage as typed config values (``pipeline/steps.py``). ``overrides`` may also reference
    earlier steps' results as text, ``@{step_id.key}`` (e.g. ``checkpoint=runs:/@{pretrain_nope.run_id}/model``),
    the replicate's seed as ``@{seed}`` and the matrix point's values as ``@{matrix.<key>}``; ``label`` names the
    method in the report. ``only`` limits the step to the matrix points whose values it lists
    (``{tokens_per_parameter: [4, 40]}``; empty: every point). ``subprocess`` runs the step as its own
    ``nope-lightning run`` process (needed for multi-process strategies: Lightning's DDP/FSDP launcher re-executes
    the command line in every extra rank). ``paper``: the row of paper 001's tables the method is printed beside,
    per table (``{table2: nope lambda=1.5, table4: headscale}``; ``paper.ROWS``), matched exactly; none: no paper
    column. ``family``: the method's family in the report's figures (``FAMILIES``; empty: a baseline)."""

    id: str = ""
    stage: str = ""
    config: str = ""
    overrides: list[str] = field(default_factory=list)
    label: str = ""
    subprocess: bool = False
    only: dict[str, list[str]] = field(default_factory=dict)
    paper: dict[str, str] = field(default_factory=dict)
    family: str = ""
    model: str = ""
    temperature: TemperatureInput = field(default_factory=TemperatureInput)


@dataclass
class PipelineConfig:
    """``nope-lightning run pipeline experiments/<name>.yaml``: a chain of stages under one MLflow parent run.

    ``common`` overrides go to every step whose config has that key (e.g. ``trainer.progress_bar=false``), or a key
    under one of its open mappings (a grid's ``task_overrides.<task>``); one that no step has fails the dry run.
    ``seeds``: every step runs once per seed (a replicate: pre-training steps train with ``seed=<seed>``, every
    later step runs on that replicate's models), each run tagged with its seed; empty means one replicate with
    the stages' own seeds. ``matrix``: every step runs once per point of the grid ``{key: [values]}`` (keys are
    used as ``@{matrix.<key>}`` in overrides), inside each replicate. Steps run replicate by replicate, point by
    point, in file order. ``claims``: ids of the claims (``paper.CLAIMS``, ``paper.HYBRID_CLAIMS``) the report tests; each names
    the methods (step labels) it compares, which the file must run. ``bootstrap``: resamples behind every
    interval of the report. ``reference``: the step label every method is paired against in the report's paired
    table (empty: no paired table); ``more_references``: further step labels, each with a paired table of its own
    (the hybrids are paired with NoPE and with RoPE). ``sweep``: ``{x: <matrix key>, lines: <matrix key>}`` adds the report's sweep
    section (measures per matrix point, plotted against ``x``, one line per value of ``lines``), with the step
    label of each ``SWEEP_ROLES`` method its measures compare (``nope: nope``, ...; a role left out is not
    measured).
    A finished step never runs twice: a step whose resolved config (less its parent run) matches a FINISHED step
    of this or any other pipeline run in the store is skipped, and a reuse from another run is recorded on this
    one (so adding a seed runs only that seed's steps); a killed pipeline resumes where it stopped. ``report`` runs the report stage at the end. ``dry_run`` runs nothing:
    it resolves and checks every step and prints the plan (``nope_lightning/pipeline/dry_run.py``).
    """

    name: str = ""
    steps: list[PipelineStep] = field(default_factory=list)
    common: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    matrix: dict[str, list[str]] = field(default_factory=dict)
    claims: list[str] = field(default_factory=list)
    bootstrap: int = 1000
    reference: str = ""
    more_references: list[str] = field(default_factory=list)
    sweep: dict[str, str] = field(default_factory=dict)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    report: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a pipeline needs a name")
        if not self.steps:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        seen: set[str] = set()
        for step in self.steps:
            if not step.id or not step.stage:
                raise ValueError(f"pipeline {self.name!r}: every step needs an id and a stage ({step})")
            if step.id in seen:
                raise ValueError(f"pipeline {self.name!r}: duplicate step id {step.id!r}")
            if step.id in ("seed", "matrix"):
                raise ValueError(f"pipeline {self.name!r}: a step cannot be called {step.id!r}, which @{{{step.id}}} "
                                 f"references mean (the replicate's seed, the matrix point); rename it")
            seen.add(step.id)
            for key, values in step.only.items():
                if key not in self.matrix or not set(values) <= set(self.matrix[key]):
                    raise ValueError(f"step {step.id!r}: only={{{key}: {values}}} names matrix values the file's "
                                     f"matrix does not have ({key}: {self.matrix.get(key, 'no such key')})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} repeats a seed: give distinct integers, e.g. seeds=[1234,2345,3456]")
        for key, values in self.matrix.items():
            if not key.isidentifier() or not values or len(set(values)) != len(values):
                raise ValueError(f"matrix key {key!r}: a matrix needs identifier keys and distinct values "
                                 f"(got {values})")
        check_bootstrap("bootstrap", self.bootstrap)
        axes = {k: self.sweep.get(k) for k in ("x", "lines")}
        if self.sweep and (None in axes.values() or not set(axes.values()) <= set(self.matrix)):
            raise ValueError(f"sweep={self.sweep}: give sweep={{x: <matrix key>, lines: <matrix key>, <role>: "
                             f"<step label>...}} (matrix keys: {', '.join(self.matrix) or 'none'})")
        self._check_claims()
        self._check_labels()

    def _check_labels(self) -> None:
        """The report's label data names known things: paper rows, families, and step labels for the reference
        and the sweep's roles; a label gives one method one place."""
        methods: dict[str, PipelineStep] = {}
        problems = []
        for step in self.steps:
            problems += [f"step {step.id!r}: paper={{{table}: {row}}}: {problem}" for table, row in step.paper.items()
                         if (problem := row_problem(table, row))]
            if step.family and step.family not in FAMILIES:
                problems.append(f"step {step.id!r}: family={step.family!r}: use one of {', '.join(FAMILIES)} or none")
            method = step.label or step.id
            other = methods.setdefault(method, step)
            if (other.paper, other.family) != (step.paper, step.family):
                problems.append(f"steps {other.id!r} and {step.id!r} both label method {method!r} but give it "
                                f"different paper rows or families; give them the same")
        for key, method in [("reference", self.reference), *(("more_references", m) for m in self.more_references)]:
            if method and method not in methods:
                problems.append(f"{key}: {method!r} is no step's label; name the method a paired table compares "
                                f"with (a step label) or leave it out")
        for role, method in self.sweep.items():
            if role in ("x", "lines"):
                continue
            if role not in SWEEP_ROLES:
                problems.append(f"sweep role {role!r} is unknown; roles: {', '.join(SWEEP_ROLES)}")
            elif method not in methods:
                problems.append(f"sweep {role}={method!r} is no step's label; name the step label of the {role} "
                                f"method")
        if problems:
            raise ValueError("\n".join(problems))

    def _check_claims(self) -> None:
        """Every claim must be known, every method it compares must be run by a step of this file (a
        ``conditional`` claim's need not: without them it is not measured), and every statistic it or its
        preconditions read must be one the claims engine computes and the file's steps produce: a claim about
        passkeys of a method whose step sets ``passkey_keys=0`` fails here, in one line, not after the compute."""
        methods = {step.label or step.id for step in self.steps}
        problems = []
        for claim_id in self.claims:
            claim = CLAIMS_BY_ID.get(claim_id)
            if claim is None:
                close = difflib.get_close_matches(claim_id, CLAIMS_BY_ID, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                problems.append(f"unknown claim {claim_id!r}; {hint}claims: {', '.join(CLAIMS_BY_ID)}")
                continue
            needed = {*(claim.methods if not claim.conditional else ()),
                      *(m for p in claim.preconditions for m in p.methods)}
            for method in sorted(needed - methods):
                problems.append(f"claim {claim_id!r} compares method {method!r}, which no step of pipeline "
                                f"{self.name!r} runs (a step label or id); add the step or drop the claim")
            problems += self._statistic_problems(claim)
        if problems:
            raise ValueError("\n".join(problems))

    def _statistic_problems(self, claim: Claim) -> list[str]:
        """Why the statistics ``claim`` reads would not exist after the run: a test or precondition the engine
        does not compute, or one whose methods' steps turn off the setting it needs (``paper.TEST_NEEDS``,
        ``paper.PRECONDITION_NEEDS``: a setting assigned 0 or false, common overrides first, a step's own last)."""
        reads = [(f"test {claim.test!r}", TEST_NEEDS.get(claim.test), claim.methods)]
        reads += [(f"precondition {p.kind!r}", PRECONDITION_NEEDS.get(p.kind), p.methods) for p in claim.preconditions]
        problems = []
        for what, settings, methods in reads:
            if settings is None:
                known = TEST_NEEDS if what.startswith("test") else PRECONDITION_NEEDS
                problems.append(f"claim {claim.id!r}: its {what} names a statistic the study does not produce "
                                f"(known: {', '.join(known)})")
                continue
            for step in self.steps:
                if (step.label or step.id) not in methods:
                    continue
                assigned = dict(_assignment(o) for o in [*self.common, *step.overrides] if "=" in o)
                off = [k for k in settings if assigned.get(k, "").strip().lower() in ("0", "false")]
                problems += [f"claim {claim.id!r}: its {what} reads {step.label or step.id!r}'s statistic that needs "
                             f"{key}, but step {step.id!r} sets {key}={assigned[key]}: the study does not produce "
                             f"it; drop the claim or measure it" for key in off]
        return problems


def _assignment(override: str) -> tuple[str, str]:
    """``key=value`` -> ``(key, value)`` as written."""
    key, _, value = override.partition("=")
    return key.strip(), value


@dataclass
class ReportSource:
    """Another source a report reads beside its own: a pipeline run ``run`` (its MLflow run id) in the store
    ``uri`` (empty: the report's own store), or ``results``, the results bundle an earlier report wrote
    (``<out_dir>/results``, e.g. committed under ``experiments/<study>/results/results``) — a study split into
    files, or one seed per file, run on several machines or days. ``steps``: read only the results of these step
    ids from it (empty: all), for a file that re-ran steps another source already holds (a seed trained again
    on another machine or torch: the same seed and recipe, not the same weights) beside the new rows that report
    needs."""

    run: str = ""
    uri: str = ""
    results: str = ""
    steps: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if bool(self.run) == bool(self.results):
            raise ValueError("also: every entry needs either run=<pipeline run id> (and uri=<store> when it is in "
                             "another store) or results=<a report's results/ folder>")
        if self.results and self.uri:
            raise ValueError("also: uri= belongs to a run= entry; a results= folder is read as it is")


@dataclass
class ReportConfig:
    """``nope-lightning run report run=<pipeline run id>``: markdown tables + PNG plots from tracked runs,
    written under ``out_dir`` (default ``mlruns/reports/<run id>``) with the results they read
    (``<out_dir>/results``, a bundle to commit with the report) and logged to MLflow. The claims tested
    (``claims``), the sweep section (``sweep``) and the bootstrap resamples (``bootstrap``) are the pipeline's
    own (its logged ``config.yaml``) unless given here (unset: ``None`` / ``0``); ``claims_from``: an experiment
    file whose ``claims`` the report judges as that file lists them now (a study's claims declared after its
    committed runs logged their files), with every source file's claims beside them. ``also``: further sources
    reported together with ``run`` (``"also=[{run: <id>}, {run: <id>, uri: 'sqlite:///other/mlflow.db'},
    {results: experiments/hybrids/results/results}]"``): their runs join ``run``'s, placed by their own tags (a
    seed or a method that two sources both hold is an error, not a silent choice); the report is logged to
    ``run``. Without ``run``, the report is made from ``also`` alone into ``out_dir`` and logged nowhere (a
    committed report regenerated from its committed results)."""

    run: str = ""
    out_dir: str = ""
    claims: list[str] | None = None
    claims_from: str = ""
    sweep: dict[str, str] | None = None
    bootstrap: int = 0
    also: list[ReportSource] = field(default_factory=list)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        if not self.run and not self.also:
            raise ValueError("run= is required: the MLflow run id of a pipeline (or also=[{results: <folder>}] "
                             "with out_dir=, to report committed results)")
        if not self.run and not self.out_dir:
            raise ValueError("a report without run= is logged nowhere: give out_dir=<folder> to write it into")
        if self.claims_from and self.claims is not None:
            raise ValueError("give claims= or claims_from=, not both: claims_from reads the claims an experiment "
                             "file lists")
        if self.claims_from and not Path(self.claims_from).is_file():
            raise ValueError(f"claims_from={self.claims_from}: no such experiment file (a path such as "
                             "experiments/regime_study/regime_study.yaml)")
        for claim_id in self.claims or ():
            if claim_id not in CLAIMS_BY_ID:
                raise ValueError(f"unknown claim {claim_id!r}; claims: {', '.join(CLAIMS_BY_ID)}")
        if self.bootstrap:
            check_bootstrap("bootstrap", self.bootstrap)

    @property
    def sources(self) -> list[tuple[TrackingConfig, str] | Path]:
        """``(store, pipeline run id)`` of ``run`` and of every ``also`` run, a ``Path`` for every ``also``
        results bundle; ``run`` first (``step_filters`` gives each one's ``steps``, in the same order)."""
        runs = [(self.tracking, self.run)] if self.run else []
        return [*runs, *(Path(s.results) if s.results else
                         (dataclasses.replace(self.tracking, uri=s.uri) if s.uri else self.tracking, s.run)
                         for s in self.also)]

    @property
    def step_filters(self) -> list[frozenset[str]]:
        """Each source's ``steps`` (empty: every step), in the order of ``sources``."""
        return [frozenset(), *(frozenset(s.steps) for s in self.also)][0 if self.run else 1:]
