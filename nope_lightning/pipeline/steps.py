"""An experiment file as runnable step instances, and what each instance's stage config is.

The one home of step resolution: the pipeline runs the instances, its dry run (``dry_run.py``) checks them.
An instance is one step of the file at one replicate seed and one matrix point: a file with ``seeds: [a, b]``
and ``matrix: {n_layer: [2, 6]}`` runs every step four times, replicate by replicate, point by point, in file
order. Inside an instance a typed input (``model: pretrain_nope``, ``temperature: {search: search_nope, at: 512}``;
``inputs.py``) and ``@{step.key}`` mean that step's result *at the same seed and point*, ``@{seed}`` the
replicate's seed and ``@{matrix.<key>}`` the point's value; typed inputs reach the stage config as a typed layer
(``typed_inputs``), the values the text form gave. Instance ids are the step id plus the point and seed,
``pretrain_nope[n_layer=2,seed=1234]``; without seeds and matrix they are the bare step ids, so files without
either behave (and resume) exactly as before.

Stages that train from scratch take the replicate's seed in the key their registry entry declares
(``Stage.seed``, a typed config layer: the seed stays an ``int``) unless the step sets that key itself: ``seed``
for a pre-training or a synthetic run, ``seeds`` (``[<seed>]``) for a synthetic grid, which so runs one grid per
replicate, each reused, resumed and tagged with its seed like any step (a file without ``seeds`` runs the grid's
own seed list as one step, whose tables average over those seeds). Every other step keeps its own settings
(HeadScale's data seed, the evaluation prompts), so across replicates only the trained models differ and
comparisons on the same prompts and tokens stay paired. A step's tracking (the pipeline's store, nested under its run) goes where its stage keeps it
(``Stage.tracking``: ``base.tracking`` for a grid, whose cells copy it).
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nope_lightning.config.core import flatten, to_dict
from nope_lightning.config.pipeline import PipelineConfig, PipelineStep
from nope_lightning.pipeline.inputs import (
    at_problem,
    defaults,
    input_problem,
    input_settings,
    inputs,
    nested,
    takes,
)
from nope_lightning.results.runkey import RunKey
from nope_lightning.stages.registry import STAGES, get_stage, stage_config

#: ``@{step.key}``, ``@{seed}`` and ``@{matrix.key}``.
REFERENCE = re.compile(r"@\{([\w-]+)(?:\.([\w/.-]+))?\}")
#: A scale-search's best lambda at a length as an earlier step's result, ``scale_search/len256/best_lambda``.
SEARCHED_LAMBDA = re.compile(r"scale_search/len(\d+)/best_lambda")


@dataclass(frozen=True)
class Instance:
    """``step`` at replicate ``seed`` (None: no ``seeds``) and matrix ``point`` ((key, value) pairs)."""

    step: PipelineStep
    seed: int | None
    point: tuple[tuple[str, str], ...]

    @property
    def key(self) -> RunKey:
        """Where this instance's run sits: method (the step's label, else its id), seed, point, stage, step."""
        return RunKey(self.step.label or self.step.id, self.seed, self.point, self.step.stage, self.step.id)

    @property
    def id(self) -> str:
        """``pretrain_nope[n_layer=2,seed=1234]``; the bare step id for a file without seeds and matrix."""
        return self.key.instance

    def of(self, step_id: str) -> str:
        """The id of step ``step_id``'s instance at this instance's seed and point."""
        return f"{step_id}{self.key.suffix}"


def points(matrix: Mapping[str, list[str]]) -> list[tuple[tuple[str, str], ...]]:
    """Every point of the grid, the first key varying slowest; ``[()]`` for no matrix."""
    keys = list(matrix)
    return [tuple(zip(keys, values, strict=True)) for values in itertools.product(*(matrix[k] for k in keys))]


def runs_at(step: PipelineStep, point: tuple[tuple[str, str], ...]) -> bool:
    values = dict(point)
    return all(values[key] in allowed for key, allowed in step.only.items())


def expand(cfg: PipelineConfig) -> list[Instance]:
    """The instances of ``cfg`` in run order (replicate, then point, then file order)."""
    return [Instance(step, seed, point) for seed in (cfg.seeds or [None]) for point in points(cfg.matrix)
            for step in cfg.steps if runs_at(step, point)]


def reference_problems(cfg: PipelineConfig) -> dict[str, list[str]]:
    """``step id -> problems`` of its references and typed inputs: an unknown, later or self step, a step that does
    not run at every point this one runs at (``source_problem``), an input the steps cannot hand over
    (``inputs.input_problem``), ``@{seed}`` without seeds, an unknown matrix key, a searched lambda passed as text
    (``searched_lambda_problem``). Empty lists when fine."""
    stages = {step.id: step.stage for step in cfg.steps}
    problems: dict[str, list[str]] = {}
    for step in cfg.steps:
        found = problems.setdefault(step.id, at_problem(step))
        for name, source in inputs(step).items():
            if problem := source_problem(f"{name}: {source}", source, name, step, cfg) or input_problem(
                    step, name, source, stages[source]):
                found.append(problem)
        for override in step.overrides:
            found += searched_lambda_problem(override)
            for name, key in REFERENCE.findall(override):
                where = f"@{{{name}{'.' + key if key else ''}}}"
                if name == "seed":
                    if not cfg.seeds:
                        found.append(f"{where} needs a list of seeds (seeds: [...]) in the file")
                elif name == "matrix":
                    if key not in cfg.matrix:
                        found.append(f"{where}: the file's matrix has no key {key!r} "
                                     f"(keys: {', '.join(cfg.matrix) or 'none'})")
                elif problem := source_problem(where, name, key, step, cfg):
                    found.append(problem)
    return problems


def source_problem(where: str, name: str, key: str, step: PipelineStep, cfg: PipelineConfig) -> str | None:
    """Why ``step`` cannot read result ``key`` of step ``name`` (``where``: the reference as written): ``name`` is
    this step, no step of the file or a later one, the reference names no result, or ``name`` skips a matrix
    point where ``step`` runs; None when it can."""
    order = [s.id for s in cfg.steps]
    if name == step.id:
        return f"{where} refers to this step itself; a step can use only earlier steps' results"
    if name not in order:
        close = difflib.get_close_matches(name, order, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{where}: no step {name!r} in this file; {hint}steps: {', '.join(order)}"
    if order.index(name) > order.index(step.id):
        return f"{where} refers to step {name!r}, which runs later (steps run in file order): move {name!r} before " \
               f"{step.id!r}"
    if not key:
        return f"{where} names a step but no result: write @{{{name}.<key>}}, e.g. @{{{name}.run_id}}"
    missing = [p for p in points(cfg.matrix) if runs_at(step, p) and not runs_at(cfg.steps[order.index(name)], p)]
    return (f"{where}: step {name!r} does not run at matrix point {dict(missing[0])}, where {step.id!r} runs (its "
            f"`only` is narrower)") if missing else None


def common_problems(cfg: PipelineConfig) -> list[str]:
    """One line per common override that no step of ``cfg`` takes (``takes``): a misspelt key would otherwise reach
    nothing and the file would run without it. A step of an unknown stage is its own problem, not counted here."""
    schemas = {step.stage: defaults(STAGES[step.stage].config_class()) for step in cfg.steps if step.stage in STAGES}
    problems = []
    for override in cfg.common:
        key = override.split("=", 1)[0].strip()
        if any(takes(schema, key) for schema in schemas.values()):
            continue
        known = sorted({k for schema in schemas.values() for k in flatten(schema)})
        close = difflib.get_close_matches(key, known, n=1)
        problems.append(f"common override {override!r}: no step of this file has the key {key!r} "
                        f"(stages: {', '.join(schemas)}){f'; did you mean {close[0]!r}?' if close else ''}")
    return problems


def searched_lambda_problem(override: str) -> list[str]:
    """A scale-search's ``best_lambda`` put into ``extension.temperature.uniform`` as text would skip the check
    that the search ran on the evaluated model: one line naming the typed reference that makes it."""
    key, _, value = override.partition("=")
    if not key.strip().endswith("extension.temperature.uniform"):
        return []
    return [f"{key.strip()}={value}: a searched lambda as text is not checked against the evaluated model; give "
            f"the step temperature: {{search: {name}, at: {match.group(1)}}}"
            for name, ref in REFERENCE.findall(value) if (match := SEARCHED_LAMBDA.fullmatch(ref))]


def substitute(text: str, instance: Instance, results: Mapping[str, Mapping[str, Any]]) -> str:
    """``text`` with ``@{seed}``, ``@{matrix.key}`` and ``@{step.key}`` (that step's result at the same seed and
    point) replaced; a clear error for a result that is not there."""
    def replace(match: re.Match) -> str:
        name, key = match.groups()
        if name == "seed":
            return str(instance.seed)
        if name == "matrix":
            return dict(instance.point)[key]
        return str(result_of(name, key, instance, results))

    return REFERENCE.sub(replace, text)


def result_of(name: str, key: str, instance: Instance, results: Mapping[str, Mapping[str, Any]]) -> Any:
    """Result ``key`` of step ``name`` at ``instance``'s seed and point; a clear error when it is not there."""
    other = instance.of(name)
    if other not in results:
        raise ValueError(f"@{{{name}.{key}}}: no earlier step {name!r} (steps run in file order)")
    if key not in results[other]:
        raise ValueError(f"@{{{name}.{key}}}: step {name!r} has no result {key!r} "
                         f"(it has {', '.join(sorted(results[other]))})")
    return results[other][key]


def typed_inputs(instance: Instance, cfg: PipelineConfig, results: Mapping[str, Mapping[str, Any]],
                 parent: str) -> dict[str, Any]:
    """``{dotted key: value}`` of ``instance``'s typed inputs (``inputs.input_settings``): from the results of the
    steps they name at its seed and point, a HeadScale step's table from that step's config under ``parent``."""
    return input_settings(instance.step, cfg.steps, lambda name, key: result_of(name, key, instance, results),
                          lambda made: step_config(Instance(made, instance.seed, instance.point), cfg, results,
                                                   parent))


def step_config(instance: Instance, cfg: PipelineConfig, results: Mapping[str, Mapping[str, Any]], parent: str):
    """The validated stage config of ``instance``: its YAML <- common overrides (where the key exists) <- the
    replicate's seed (the stages that declare a ``Stage.seed``; a typed layer, an ``int``) <- its typed inputs (a
    typed layer, ``typed_inputs``) <- its overrides with references resolved <- the pipeline's tracking at the
    stage's ``Stage.tracking``, nested under ``parent``, and a run name unique to the instance."""
    step, stage = instance.step, get_stage(instance.step.stage)
    schema = defaults(stage.config_class())
    common = [o for o in cfg.common if takes(schema, o.split("=", 1)[0])]
    overrides = [substitute(o, instance, results) for o in step.overrides]
    # Before the step's overrides: a step that sets its seed itself keeps it.
    seeded = stage.seed_layer(instance.seed) if instance.seed is not None and stage.seed else {}
    t = cfg.tracking
    tracked = [f"{stage.tracking}.{key}={value}" for key, value in (
        ("uri", t.uri), ("artifact_root", t.artifact_root), ("experiment", t.experiment),
        ("parent_run_id", parent))] if stage.tracking else []
    if step.label and takes(schema, "name"):
        tracked.append(f"name={step.label}{instance.key.suffix}")
    linked = nested(typed_inputs(instance, cfg, results, parent))
    return stage_config(step.stage, config_path(step.config), [*overrides, *tracked], layers=[common, seeded, linked])


def config_path(path: str) -> str | None:
    """A step's YAML: as given if it exists, else relative to the repository (``conf/...`` from anywhere)."""
    if not path or Path(path).exists():
        return path or None
    in_repo = Path(__file__).resolve().parents[2] / path
    return str(in_repo) if in_repo.exists() else path


#: Fields added to the schemas after step hashes were first recorded, with their defaults (by name, wherever they
#: sit: the model's, an extension's or a stage's own): at its default such a field leaves a step's identity as it
#: was, so the finished steps of a store survive the upgrade that added it. Add a new field here with its default.
ADDED_FIELDS: dict[str, Any] = {
    # per-layer position encodings and windows (hybrid NoPE/RoPE models), iRoPE's temperature and its search
    "layer_pattern": [], "nope_every": 0, "layer_windows": [], "rope_window": None, "irope_beta": 0.0,
    "irope_floor": 1.0, "parameter": "lambda",
    # a synthetic grid's per-task recipes, and a curriculum over the training lengths
    "task_overrides": {}, "curriculum_steps": 0,
    # the learned temperature table with some layers reset to 1 (HeadScale's retrieval probe)
    "reset_layers": [],
    # torch's fused AdamW kernel
    "fused": False,
    # a per-head lambda applied past the training length only (HeadScale past L)
    "past_only": False,
    # a scale-search's best lambda as a typed reference, checked against the evaluated model
    "uniform_search": "", "uniform_search_len": 0,
    # an imported Hugging Face model's vocabulary, unpadded
    "padding_multiple": 64,
    # a given tokenizer.json, and the streaming (litdata) prepare of a pretraining corpus
    "tokenizer": "", "engine": "memory",
    # last.ckpt by training time as well as by steps (a stop loses at most those minutes)
    "checkpoint_minutes": 3.0,
    # a synthetic run's stopping rule, its held-out in-distribution test split, and the token embeddings' init
    "stop_at": 0.0, "stop_patience": 1, "n_id_test": 0, "embedding_init": "gpt2",
    # weight decay on T5's relative-bias table (the reference leaves it undecayed)
    "decay_position_bias": True,
}

#: Fields whose value never changes a step's result, hashed as the one value every step recorded before they
#: became settings of several values: activation checkpointing recomputes the same activations (it was a bool,
#: true by default; its "auto" default and false hash as that true did).
EXECUTION_ONLY: dict[str, Any] = {"activation_checkpointing": True}


def identity(cfg: Any, drop: tuple[str, ...] = ()) -> dict:
    """``to_dict(cfg)`` less the ``ADDED_FIELDS`` that hold their defaults and less every key in ``drop``, at
    any depth, with every ``EXECUTION_ONLY`` field at its recorded value."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: EXECUTION_ONLY[k] if k in EXECUTION_ONLY else strip(v) for k, v in value.items()
                    if k not in drop and not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}
        return [strip(v) for v in value] if isinstance(value, list) else value

    return strip(to_dict(cfg))


def step_hash(stage_cfg: Any) -> str:
    """The identity of a step's work: its resolved stage config less every ``tracking.parent_run_id``, so the
    same step under another pipeline run (a rerun with more seeds, another file) has the same hash; 16 hex."""
    text = json.dumps(identity(stage_cfg, drop=("parent_run_id",)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded_hash(stage_cfg: Any) -> str:
    """The hash step records held before ``step_hash`` (of the whole config, parent run included), so a pipeline
    run started then still skips the steps it finished; 16 hex."""
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(identity(stage_cfg))).encode()).hexdigest()[:16]


#: Pipeline fields that change no step: a rerun with other claims or another bootstrap size resumes the same
#: parent run (and only redoes the report).
REPORT_ONLY = ("dry_run", "report", "claims", "bootstrap", "sweep", "reference", "more_references")
#: A step's fields that only place its method in the report (the paper row beside it, its family).
STEP_REPORT_ONLY = ("paper", "family")


def pipeline_hash(cfg: PipelineConfig) -> str:
    """The identity of the steps a pipeline runs: its config less ``REPORT_ONLY`` fields, its steps'
    ``STEP_REPORT_ONLY`` ones and the ``ADDED_FIELDS`` at their defaults, and less ``seeds`` and ``matrix`` when
    empty, so a pipeline started before those fields existed still finds its parent run. A step's typed inputs
    count as the text overrides they stand for (``checkpoint=runs:/@{pretrain_nope.run_id}/model``: ``Named``),
    first among its overrides: a step without inputs hashes as before they existed, and a file keeps its hash
    when it moves overrides written first to typed inputs."""
    fields = {k: v for k, v in identity(cfg, drop=STEP_REPORT_ONLY).items()
              if k not in REPORT_ONLY and not (k in ("seeds", "matrix") and not v)}
    first = {instance.step.id: instance for instance in reversed(expand(cfg))}
    for step, written in zip(cfg.steps, fields["steps"], strict=True):
        del written["model"], written["temperature"]
        if inputs(step) and step.id in first:
            settings = typed_inputs(first[step.id], cfg, Named(), "named")
            written["overrides"] = [*(f"{key}={value}" for key, value in settings.items()), *written["overrides"]]
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(fields)).encode()).hexdigest()[:16]


class Named(dict):
    """Results standing as the text that names them, for any instance: ``Named()[<instance id>][key]`` is
    ``@{<step id>.<key>}`` (``Named(<step id>)[key]``)."""

    def __init__(self, step: str = ""):
        super().__init__()
        self.step = step

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> Any:
        return f"@{{{self.step}.{key}}}" if self.step else Named(key.partition("[")[0])
