"""Typed configuration: dataclass schema <- YAML <- ``key=value`` overrides, merged with OmegaConf.

Every stage has one config dataclass (``config/stages.py``, ``config/pipeline.py``) built from the shared pieces
(``config/parts.py``). ``load_config`` merges the defaults of that dataclass with an optional YAML file (which
holds only differences) and a dotlist of command-line overrides, then turns the result back into the dataclass.
Unknown keys, wrong types, bad choices and out-of-range values all raise ``ValueError`` naming the key, before
any compute. This module holds the merge, the checks every dataclass uses and the choices they accept.

Units: temperatures (``model.temperature`` and per-head tables) are in units of 1/sqrt(head_size):
``1.0`` is the standard softmax scale, the papers' "1.2" means lambda = 1.2/sqrt(d).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

POS_ENCODINGS = ("nope", "rope", "alibi", "learned", "sinusoidal", "t5")
ROPE_SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "yarn_paper")
ATTENTION_BACKENDS = ("sdpa", "flash")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp", "fsdp2")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
CHECKPOINTING = ("auto", "true", "false")
#: The fewest bootstrap resamples a config may ask for: below ~100 the 2.5 % / 97.5 % percentiles rest on a
#: handful of resamples and move from run to run.
MIN_RESAMPLES = 100

T = TypeVar("T")
_ABSENT = object()
#: Lines ``load_config`` already printed: a pipeline loads each step's config more than once.
_SAID: set[str] = set()
#: A config layer above the YAML file: ``key=value`` overrides, or a nested dict of typed values.
Layer = list[str] | tuple[str, ...] | Mapping[str, Any]


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not a valid choice; pick one of {', '.join(choices)}")


def check_bootstrap(key: str, resamples: int) -> None:
    """A bootstrap needs enough resamples for stable 2.5 % / 97.5 % percentiles (``stats.MIN_RESAMPLES``)."""
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"{key}={resamples} bootstrap resamples are too few for a 95 % interval: use >= "
                         f"{MIN_RESAMPLES} (1000 is the default)")


def check_range(key: str, value: float, low: float | None = None, high: float | None = None,
                low_open: bool = False) -> None:
    """Raise ``ValueError`` unless ``low <= value <= high`` (``low < value`` when ``low_open``)."""
    if low is not None and (value <= low if low_open else value < low):
        op = ">" if low_open else ">="
        raise ValueError(f"{key}={value} is out of range: it must be {op} {low}")
    if high is not None and value > high:
        raise ValueError(f"{key}={value} is out of range: it must be <= {high}")



PASSKEY_PROMPTS = ("reference", "compact")
RETRIEVAL_FILLERS = ("corpus", "reference", "mixed")
RETRIEVAL_LENGTHS = ("uniform", "full")
SPLITS = ("val", "test")
DATA_MIXES = ("recipe", "text")
DATA_ENGINES = ("memory", "litdata")
LONGCTX_TASKS = ("multikey_retrieval", "passage_retrieval", "passage_count", "variable_tracking")


def _format_error(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or ""
    msg = str(err).splitlines()[0]
    return f"config key '{key}': {msg}" if key else msg


def load_config(cls: type[T] | T, yaml_path: str | os.PathLike | None = None,
                overrides: list[str] | tuple[str, ...] = (), *, layers: Sequence[Layer] = ()) -> T:
    """Merge ``cls`` defaults <- YAML file (after the files it ``extends``, ``file_layers``) <- ``layers`` in order
    <- ``key=value`` overrides into a validated ``cls``. ``cls`` may be a config instance: its values stand in for
    the defaults (a synthetic grid's per-task overrides of ``base``). A layer is a list of ``key=value``
    overrides or a nested dict of typed values, which reach the config without passing through text (a
    pipeline's replicate seed, ``pipeline/steps.py``).

    Two keys that set one training budget (a config class's ``budget_keys``: ``PretrainConfig``'s
    ``tokens_per_parameter`` and ``trainer.max_steps``) resolve to one by ``settle_budget``.

    Raises ``ValueError`` (naming the key) for unknown keys, wrong types, bad choices, out-of-range
    values and malformed overrides, and (``file:line:column``) for a file that is not valid YAML;
    ``FileNotFoundError`` for a missing YAML file.
    """
    stack: list[Any] = [OmegaConf.structured(cls)]
    if yaml_path is not None:
        stack.extend(file_layers(Path(yaml_path)))
    files = len(stack) - 1
    given = [*layers, overrides]
    _check_form([o for layer in given if not isinstance(layer, Mapping) for o in layer])
    with _worded_errors():
        stack += [OmegaConf.create(dict(layer)) if isinstance(layer, Mapping) else OmegaConf.from_dotlist(list(layer))
                  for layer in given]
        merged = OmegaConf.merge(*stack)
        for prefix, (budget, other), optional in _budget_keys(cls if isinstance(cls, type) else type(cls)):
            settle_budget(merged, stack, files, prefix + budget, prefix + other, optional)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ValueError(f"missing required config values: {', '.join(missing)}")
        return OmegaConf.to_object(merged)  # runs every __post_init__ check


def settle_budget(merged: Any, stack: Sequence[Any], files: int, budget: str, other: str,
                  optional: bool) -> None:
    """One training budget in ``merged`` when two keys set it: ``budget`` (e.g. ``tokens_per_parameter``;
    None: unset) and ``other``, the key the stage reads without it (``trainer.max_steps``). The later layer of
    ``stack`` (defaults, ``files`` file layers, then the layers given in code or on the command line) wins,
    with one line on stderr; an ``other`` that wins unsets an ``optional`` ``budget``, or else gives it its
    value. Both in one file: ``budget`` wins silently (a resolved config, which a run logs and a pipeline's
    subprocess reads, holds both); both in one given layer (one command line) is refused."""
    value, steps = OmegaConf.select(merged, budget), OmegaConf.select(merged, other)
    at_budget, at_other = _last_layer(stack, budget), _last_layer(stack, other)
    if value is None or not at_other or (at_budget == at_other and at_budget <= files):
        return
    shown = {budget: f"{budget}={_shown(value)}", other: f"{other}={_shown(steps)}"}
    if at_budget == at_other:
        raise ValueError(f"{shown[budget]} and {shown[other]} both set the training budget: give one of them")
    winner, loser = (budget, other) if at_budget > at_other else (other, budget)
    _say(f"config: {shown[winner]} given: it replaces {shown[loser]}'s budget")
    if winner == other:
        OmegaConf.update(merged, budget, None if optional else steps)


def _last_layer(stack: Sequence[Any], key: str) -> int:
    """The index of the last layer of ``stack`` setting ``key``; 0 (the defaults) when no layer above does."""
    return max((i for i, layer in enumerate(stack) if i and OmegaConf.select(
        layer, key, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT), default=0)


@functools.cache
def _budget_keys(kind: type, prefix: str = "") -> tuple[tuple[str, tuple[str, str], bool], ...]:
    """``(prefix, budget_keys, whether the budget may be None)`` of config class ``kind`` and of its sections,
    nested ones (a search's ``base``) included."""
    hints = typing.get_type_hints(kind)
    found = () if not hasattr(kind, "budget_keys") else (
        (prefix, kind.budget_keys, type(None) in typing.get_args(hints[kind.budget_keys[0]])),)
    return found + tuple(entry for name, hint in hints.items() if dataclasses.is_dataclass(hint)
                         for entry in _budget_keys(hint, f"{prefix}{name}."))


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _say(line: str) -> None:
    """``line`` on stderr, once per process."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def check_keys(cfg: type[T] | T, overrides: Sequence[str]) -> None:
    """Raise ``ValueError`` (as ``load_config`` words it) for a malformed override, an unknown key or a value of the
    wrong type in ``overrides`` merged onto ``cfg``, without the config's own value checks (``__post_init__``): for
    overrides kept to be merged later, in a context that decides whether their values are valid."""
    _check_form(overrides)
    with _worded_errors():
        OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.from_dotlist(list(overrides)))


def _check_form(overrides: Sequence[str]) -> None:
    """``ValueError`` naming the overrides that are not ``key=value``."""
    if bad := [o for o in overrides if "=" not in o or o.startswith("=")]:
        raise ValueError(f"overrides must look like key=value, got: {' '.join(bad)}")


@contextlib.contextmanager
def _worded_errors() -> Iterator[None]:
    """OmegaConf's and YAML's errors inside as one-line ``ValueError``s naming the key or the fix."""
    try:
        yield
    except OmegaConfBaseException as err:
        raise ValueError(_format_error(err)) from None
    except yaml.YAMLError as err:  # a malformed value in an override, e.g. an unquoted '{' in a list
        raise ValueError(f"cannot parse an override value: {str(err).splitlines()[0]} (quote it)") from None


def file_layers(path: Path, inside: tuple[Path, ...] = ()) -> list[Any]:
    """The YAML file ``path`` as merge layers, lowest first: the file its ``extends:`` key names (a path relative
    to ``path``; itself possibly extending another), then ``path`` without that key, whose values win (a list,
    e.g. ``seeds`` or ``steps``, replaces the base's). So a study's second file can run the first's steps with other
    seeds without a copy of them. A missing file, a non-mapping or a cycle of files is one line."""
    extended = f" (extended by {inside[-1]})" if inside else ""
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}{extended}")
    loaded = read_yaml(path, extended)
    if not OmegaConf.is_dict(loaded):
        raise ValueError(f"{path}: a config file must hold a mapping of keys, got {type(loaded).__name__}")
    base = loaded.pop("extends", None)
    if base is None:
        return [loaded]
    parent = (path.parent / str(base)).resolve()
    if parent in inside or parent == path.resolve():
        raise ValueError(f"{path}: extends {base}, which leads back to {path.name} (a cycle of files)")
    return [*file_layers(parent, (*inside, path.resolve())), loaded]


def read_yaml(path: Path, where: str = "") -> Any:
    """The YAML file ``path`` as OmegaConf reads it (a duplicate key is an error); a file that is not valid
    YAML is one line ``path:line:column: ...`` (1-based, ``where`` appended), not PyYAML's many lines."""
    try:
        return OmegaConf.load(path)
    except yaml.MarkedYAMLError as err:
        mark, began = err.problem_mark, err.context_mark
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        why = f" ({err.context} at {began.line + 1}:{began.column + 1})" if began and err.context else ""
        raise ValueError(f"{path}{at}: not valid YAML: {err.problem or err.context}{why}{where}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as a plain nested dict (for logging and saving)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text; ``load_config(type(cfg), file)`` reads it back unchanged."""
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def check_target_length(key: str, value: int) -> None:
    check_range(key, value, 2)
