"""A step's typed inputs: the earlier steps it names by id (``PipelineStep.model``, ``.temperature``), what each
hands over and where in the reading stage's config it goes.

``model: pretrain_nope`` is the model that step trained (``runs:/<run id>/model``, the export its run logged) or
imported (its export folder); ``temperature: {search: search_nope, at: 512}`` that search's best uniform lambda at
512 tokens (an evaluation's ``extension.temperature.uniform_search`` and ``_len``; a HeadScale run's start,
``scale_search``, at its own ``target_len``); ``{fit: search_nope}`` the search's log-law fit
(``log_slope_fit``); ``{headscale: headscale_4x}`` the table that HeadScale step learned, ``runs:/<run id>/<its
file>``, under ``table`` or ``log_slope_table`` as its ``parameterization`` says. Each is that step's result at
the same seed and matrix point, handed to the stage as a typed config layer (``steps.step_config``): the values
the text form (``checkpoint=runs:/@{pretrain_nope.run_id}/model``) gave, so resolved configs and step hashes are
the same either way.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import is_dataclass
from typing import Any

from omegaconf import OmegaConf

from nope_lightning.config.pipeline import PipelineStep
from nope_lightning.stages.headscale import PARAMETERIZATIONS
from nope_lightning.stages.registry import STAGES

#: A ``model`` input's checkpoint, by the stage of the step it names: the result holding that step's model and
#: the reference made of it (the export pretrain and finetune log with their run; an import's export folder).
MODEL_REFERENCES = {"pretrain": ("run_id", "runs:/{}/model"), "finetune": ("run_id", "runs:/{}/model"),
                    "import": ("checkpoint", "{}")}
#: Per typed input: what it hands over, the stages of the steps it may name, and the config keys it may set: the
#: first that the reading stage has, at its top level or in its ``base`` (a search's HeadScale run); a HeadScale
#: table's key is the one its parameterization learned (``input_settings``).
INPUTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "model": ("model", tuple(MODEL_REFERENCES), ("checkpoint",)),
    "temperature.search": ("searched lambda", ("scale-search",), ("extension.temperature.uniform_search",
                                                                    "scale_search")),
    "temperature.fit": ("lambda fit", ("scale-search",), ("extension.temperature.log_slope_fit",)),
    "temperature.headscale": ("temperature table", ("headscale",), ("extension.temperature.table",)),
}
#: The keys a HeadScale table may land in; a step's overrides setting one of them conflicts with the input.
TABLE_KEYS = ("extension.temperature.table", "extension.temperature.log_slope_table")


def inputs(step: PipelineStep) -> dict[str, str]:
    """``{input: step id}`` of the typed inputs ``step`` names (``INPUTS``), in that order."""
    named = {"model": step.model, **{f"temperature.{k}": getattr(step.temperature, k)
                                     for k in ("search", "fit", "headscale")}}
    return {name: source for name, source in named.items() if source}


def input_key(stage: str, name: str) -> str | None:
    """The config key of stage ``stage`` that typed input ``name`` sets; None when it takes no such input."""
    keys = [key for base in INPUTS[name][2] for key in (base, f"base.{base}")]
    return next((key for key in keys if takes(schema_of(stage), key)), None)


def input_problem(step: PipelineStep, name: str, source: str, source_stage: str) -> str | None:
    """Why typed input ``name`` of ``step`` cannot be step ``source`` (an earlier step of stage ``source_stage``):
    that stage makes no such thing, ``step``'s stage takes none, a search without the length of its lambda (or
    HeadScale's with one), or the step's overrides set its key too; None when it can."""
    what, makers, keys = INPUTS[name]
    where, at = f"{name}: {source}", step.temperature.at
    if source_stage not in makers:
        return f"{where}: step {source!r} runs {source_stage}, which makes no {what}; name a " \
               f"{' or '.join(makers)} step"
    if step.stage not in STAGES:
        return None  # an unknown stage is a problem of its own
    if (key := input_key(step.stage, name)) is None:
        return f"{where}: stage {step.stage} takes no {what} (it has no {' or '.join(keys)}); drop {name}"
    if key.endswith("uniform_search") and at <= 0:
        return f"{where}: give temperature.at, the length (tokens) whose best lambda to apply, one of step " \
               f"{source!r}'s target_lengths"
    if key.endswith("scale_search") and at:
        return f"temperature.at={at}: stage {step.stage} starts from the search's lambda at its own target_len; " \
               f"drop temperature.at"
    both = {o.split("=", 1)[0].strip() for o in step.overrides} & (
        {key, f"{key}_len"} if name != "temperature.headscale" else set(TABLE_KEYS))
    return f"{where} sets {', '.join(sorted(both))}, which the step's overrides set too; keep {name} and drop " \
           f"the override" if both else None


def at_problem(step: PipelineStep) -> list[str]:
    """``temperature.at`` without ``temperature.search``: a length of no search."""
    at = step.temperature.at
    return [f"temperature.at={at} is the length (tokens) of a searched lambda: name the scale-search step too, "
            f"temperature: {{search: <step id>, at: {at}}}"] if at and not step.temperature.search else []


def input_settings(step: PipelineStep, steps: list[PipelineStep], result: Callable[[str, str], Any],
                   configure: Callable[[PipelineStep], Any]) -> dict[str, Any]:
    """``{dotted config key: value}`` that ``step``'s typed inputs set, from ``result(step id, key)`` of the steps
    they name (of the file's ``steps``) at the same seed and point: a model's reference (``MODEL_REFERENCES``), a
    search's run id (and ``at``, its length), a HeadScale table as ``runs:/<run id>/<file>``, its key and file those
    of the parameterization that step learned (``stages.headscale.PARAMETERIZATIONS``) as ``configure(that step)``,
    its resolved config, says. ``ValueError`` for an input the steps cannot hand over (``input_problem``; the dry
    run says so first)."""
    settings: dict[str, Any] = {}
    for name, source in inputs(step).items():
        made = next((s for s in steps if s.id == source), None)
        if problem := f"{name}: no step {source!r}" if made is None else input_problem(step, name, source, made.stage):
            raise ValueError(problem)
        key = input_key(step.stage, name)
        if name == "model":
            held, reference = MODEL_REFERENCES[made.stage]
            settings[key] = reference.format(result(source, held))
        elif name == "temperature.headscale":
            learned = PARAMETERIZATIONS[configure(made).parameterization]
            table = f"{key.rpartition('.')[0]}.{learned.table.field}"
            settings[table] = f"runs:/{result(source, 'run_id')}/{learned.table_file}"
        else:
            settings[key] = result(source, "run_id")
            if key.endswith("uniform_search"):
                settings[f"{key}_len"] = step.temperature.at
    return settings


def nested(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``: dotted keys as the nested dict of a typed config layer."""
    tree: dict[str, Any] = {}
    for key, value in settings.items():
        *sections, leaf = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return tree


def takes(schema: Mapping[str, Any], key: str) -> bool:
    """Whether a config of defaults ``schema`` (nested dicts) has the dotted ``key``: a leaf or section of it, or a
    key under one of its open mappings (``task_overrides.sort`` of a grid, whose ``task_overrides`` is ``{}`` by
    default and takes any task), so a common override reaches the steps that know it and skips the others."""
    node: Any = schema
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return False
        if not node:
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def defaults(cls) -> dict:
    """A config class's default values as a nested dict (no validation: required fields may be empty)."""
    return OmegaConf.to_container(OmegaConf.structured(cls))


@functools.cache
def schema_of(stage: str) -> dict:
    """``defaults`` of stage ``stage``'s config; a required section (a search's ``base``) as its class's."""
    cls = STAGES[stage].config_class()
    schema = defaults(cls)
    for name, hint in typing.get_type_hints(cls).items():
        if is_dataclass(hint) and not isinstance(schema.get(name), dict):
            schema[name] = defaults(hint)
    return schema


#: The text references a typed input stands for: ``(input, override key ends with, value)``, the value naming the
#: step (``as_inputs``).
TEXT_FORMS = [(name, ends, re.compile(value)) for name, ends, value in (
    ("model", ("checkpoint",), r"runs:/@\{([\w-]+)\.run_id\}/model|@\{([\w-]+)\.checkpoint\}"),
    ("search", ("uniform_search", "scale_search"), r"@\{([\w-]+)\.run_id\}"),
    ("fit", ("log_slope_fit",), r"@\{([\w-]+)\.run_id\}"),
    ("headscale", TABLE_KEYS, r"runs:/@\{([\w-]+)\.run_id\}/headscale/\w+\.safetensors"))]


def as_inputs(step: PipelineStep) -> PipelineStep:
    """``step`` with the overrides a typed input stands for (``checkpoint=runs:/@{pretrain_nope.run_id}/model``,
    ``extension.temperature.uniform_search=@{search_nope.run_id}`` and its ``_len``, a HeadScale table's
    ``runs:/@{headscale_4x.run_id}/headscale/…``) moved into its typed inputs: the same pipeline, as a file with
    typed inputs writes it (a parent run logged before them is found so, ``store.find_parent``)."""
    if step.model or step.temperature != type(step.temperature)():
        return step  # inputs already typed: left as written
    pairs = [(key.strip(), value.strip()) for key, _, value in (o.partition("=") for o in step.overrides)]
    found: dict[str, Any] = {}
    moved = set()
    for number, (key, value) in enumerate(pairs):
        hit = next(((name, m) for name, ends, form in TEXT_FORMS if key.endswith(ends) and name not in found
                    and (m := form.fullmatch(value))), None)
        if hit:
            found[hit[0]] = next(group for group in hit[1].groups() if group)
            moved.add(number)
    for number, (key, value) in enumerate(pairs):  # the length of a searched lambda moves with its search
        if "search" in found and "at" not in found and key.endswith("uniform_search_len") and value.isdigit():
            found["at"] = int(value)
            moved.add(number)
    if not found:
        return step
    kept = [override for number, override in enumerate(step.overrides) if number not in moved]
    model = found.pop("model", "")
    temperature = dataclasses.replace(step.temperature, **found)
    return dataclasses.replace(step, overrides=kept, model=model, temperature=temperature)
