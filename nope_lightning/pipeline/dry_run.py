"""The dry run of an experiment file (``nope-lightning run pipeline <file> dry_run=true``).

Every step's config is resolved exactly as the real run resolves it (``pipeline.step_config``), with
placeholders standing for the results of the steps before it, as each stage declares them
(``run.Stage.result_keys``): ``dry-run-<step id>`` for a run id, ``1`` / ``1.0`` for counts and metrics (a
``best_lambda`` of 1.0 is a valid temperature), ``dry-run/<step id>/<key>`` for paths. The model a step reads and
the search its lambda comes from are those of the steps its typed inputs name (``model: pretrain_nope``,
``temperature: {search: search_nope, at: 512}``); a text reference's are found by its placeholder
(``runs:/dry-run-pretrain_nope/model``). Then references, lengths and token budgets are checked against what the
steps will produce. Nothing is computed: no model is built, no data is prepared (a
preparation already in the cache is read), no MLflow run is created. A Hugging Face Llama folder, named by an
``import`` step or directly (``checkpoint=nope:<folder>``, ``rope:<folder>``, or a folder that says its
encoding), is checked through its ``config.json`` alone (``hf.hf_model_config``: size, training length, max
positions, encoding), as the import will read it; a missing folder is a problem of its step.

The result is the plan (steps in order: stage, label, model, lengths, training tokens, estimated seconds
(``estimate.py``), what the store holds of it (``store.finished_steps``, read only), problems) and its totals; any
problem raises one ``ValueError`` with one line per problem, each naming its step.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nope_lightning.config.data import DataConfig
from nope_lightning.config.parts import AttentionTemperature
from nope_lightning.config.pipeline import PipelineConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig
from nope_lightning.eval.longctx import answer_tokens
from nope_lightning.model.hf import hf_model_config, is_hf_folder, parse_reference
from nope_lightning.pipeline import estimate
from nope_lightning.pipeline.data_checks import check_documents, check_training_data
from nope_lightning.pipeline.inputs import MODEL_REFERENCES, inputs
from nope_lightning.pipeline.steps import Instance, common_problems, expand, reference_problems, step_config
from nope_lightning.pipeline.store import finished_steps
from nope_lightning.runtime.progress import duration, pipeline_line
from nope_lightning.stages.registry import get_stage
from nope_lightning.training.budget import (
    check_rope_model,
    check_target_len,
    output_dir,
    training_tokens,
    with_budget,
)

PARENT = "dry-run-parent"  # the parent run id the step configs are nested under (no run is created)
SEARCHED_UNIFORM = 2.0  # a searched lambda's stand-in in the model config the dry run builds (any lambda != 1)

@dataclass(frozen=True)
class Model:
    """A model a step of this file trains: the step, and its pre-training config (architecture, train_len,
    data; a fine-tune keeps its base's)."""

    step: str
    cfg: PretrainConfig


@dataclass(frozen=True)
class Search:
    """A scale-search a step of this file runs: the step, the model it searches on (None: not trained here) and
    its target lengths (tokens)."""

    step: str
    model: Model | None
    targets: tuple[int, ...]


class Placeholders(dict):
    """Stand-ins for the results of a step not run yet: ``{key: value}`` for every key its stage returns.
    ``open`` (keys not knowable before it runs, or a step whose config failed) takes any key, so a later
    step is not blamed for an earlier one's problem."""

    def __init__(self, step: str, keys: dict[str, type] | None):
        super().__init__({key: placeholder(step, key, kind) for key, kind in (keys or {}).items()})
        self.step, self.open = step, keys is None

    def __contains__(self, key: object) -> bool:
        return self.open or super().__contains__(key)

    def __missing__(self, key: str) -> Any:
        if not self.open:
            raise KeyError(key)
        return placeholder(self.step, key, str if key == "run_id" else float)


def placeholder(step: str, key: str, kind: type) -> Any:
    """``1`` / ``1.0`` for numbers, ``dry-run-<instance>`` for a run id, ``dry-run/<instance>/<key>`` for paths
    (the instance id's brackets and commas made path- and override-safe)."""
    if kind is not str:
        return kind(1)
    name = re.sub(r"[^\w.-]+", "-", step).strip("-")
    return f"dry-run-{name}" if key == "run_id" else f"dry-run/{name}/{key}"


def plan(cfg: PipelineConfig, quiet: bool = False) -> dict[str, Any]:
    """The dry run: the plan of ``cfg`` as a JSON-able dict, one entry per instance (step x seed x matrix
    point); ``ValueError`` listing every problem, one a line. ``quiet``: no progress lines (the real run checks
    its file this way before any compute)."""
    references = reference_problems(cfg)
    results: dict[str, dict] = {}
    # By instance id (typed inputs) and by the placeholder of its run or export folder (text references):
    models: dict[str, Model] = {}  # the models steps train, fine-tune or import
    searches: dict[str, Search] = {}  # the scale-searches
    instances = expand(cfg)
    steps = [plan_step(instance, cfg, references[instance.step.id], results, models, searches)
             for instance in instances]
    problems = list(dict.fromkeys(f"step {s['id']}: {p}" for s in steps for p in s["problems"]))
    problems += common_problems(cfg) + shared_out_dirs(steps)
    # What the store holds: read only, and only to show (the real run looks it up again as it goes).
    finished = {} if quiet or problems else finished_steps(cfg, instances, results, PARENT)
    for entry in steps:
        entry["finished"] = finished.get(entry["id"], "")
    if not quiet:
        for number, (instance, entry) in enumerate(zip(instances, steps, strict=True), 1):
            pipeline_line(f"[{number}/{len(instances)}] {instance.step.stage} {instance.id}: dry run: "
                          f"{step_status(entry)}")
    if problems:
        raise ValueError(f"dry run of pipeline {cfg.name!r}: {len(problems)} problem(s):\n" + "\n".join(problems))
    total = estimate.total(steps)
    if not quiet:
        pipeline_line(f"{cfg.name}: {estimate.total_line(total)}")
    return {"name": cfg.name, "dry_run": True, "seeds": list(cfg.seeds), "matrix": dict(cfg.matrix),
            "claims": list(cfg.claims), "steps": steps, "report": cfg.report,
            "training_tokens": sum(s["training_tokens"] for s in steps), **total, "problems": []}


def step_status(entry: dict) -> str:
    """``ok; estimate 13 min[; finished under ...]``, or the step's problems."""
    if entry["problems"]:
        return "; ".join(entry["problems"])
    cost = "no estimate (a model made elsewhere)" if entry["estimate_s"] is None else (
        f"estimate {duration(entry['estimate_s'])}")
    return "; ".join(filter(None, ["ok", cost, entry["finished"]]))


def plan_step(instance: Instance, cfg: PipelineConfig, references: list[str], results: dict[str, dict],
              models: dict[str, Model], searches: dict[str, Search]) -> dict[str, Any]:
    """One instance's plan entry; records its placeholder results (and the model it trains, or the search it
    is) for the later ones."""
    step = instance.step
    entry: dict[str, Any] = {"id": instance.id, "stage": step.stage, "label": step.label, "model": None,
                             "lengths": {}, "training_tokens": 0, "data": None, "notes": [], "estimate_s": None,
                             "problems": list(references)}
    if not entry["problems"] and (failed := [s for s in inputs(step).values() if results[instance.of(s)].open]):
        entry["notes"].append(f"unchecked: step {failed[0]!r}, whose results it reads, has problems")
        results[instance.id] = Placeholders(instance.id, None)
        return entry
    if not entry["problems"]:
        try:
            stage_cfg = step_config(instance, cfg, results, PARENT)
            checkpoint = (stage_cfg.base.checkpoint if step.stage == "headscale-search"
                          else getattr(stage_cfg, "checkpoint", ""))
            known = models.get(instance.of(step.model) if step.model else run_id_of(checkpoint) or checkpoint)
            model = step_model(instance.id, step.stage, stage_cfg, checkpoint, known)
        except (ValueError, FileNotFoundError) as err:
            entry["problems"].append(str(err).splitlines()[0])
    if entry["problems"]:
        results[instance.id] = Placeholders(instance.id, None)
        return entry
    if model is not None:
        size = f"{model.cfg.model.n_layer} layers x {model.cfg.model.n_embd}, {model.cfg.model.n_head} heads"
        entry["model"] = {"from": model.step, "pos_encoding": model.cfg.model.pos_encoding, "size": size,
                          "train_len": model.cfg.train_len, "max_positions": model.cfg.model.max_positions}
    elif checkpoint:
        entry["model"] = {"from": checkpoint}
        entry["notes"].append(f"checkpoint {checkpoint} is not trained by this file: its lengths are unchecked")
    if step.stage in CHECKS:
        CHECKS[step.stage](stage_cfg, model, entry)
    if not entry["problems"]:
        entry["estimate_s"] = estimate.seconds(step.stage, stage_cfg, model.cfg if model is not None else None)
    if step.stage == "evaluate" and (searched := stage_cfg.extension.temperature).uniform_search:
        search = searches.get(instance.of(step.temperature.search) if step.temperature.search
                              else searched.uniform_search.removeprefix("runs:/").split("/")[0])
        searched_lambda_problems(searched, model, search, entry, typed=bool(step.temperature.search))
    keys = get_stage(step.stage).result_keys(stage_cfg, model.cfg.train_len if model is not None else None)
    made = results[instance.id] = Placeholders(instance.id, keys)
    if step.stage in MODEL_REFERENCES and model is not None:  # the result holding its model (run or folder)
        models[instance.id] = models[made[MODEL_REFERENCES[step.stage][0]]] = Model(instance.id, model.cfg)
    if step.stage == "import":
        entry["model"]["source"], entry["lengths"] = stage_cfg.source, {"train_len": model.cfg.train_len}
    if step.stage == "scale-search":
        search = Search(instance.id, model, tuple(stage_cfg.target_lengths))
        searches[instance.id] = searches[made["run_id"]] = search
    return entry


def step_model(step: str, stage: str, cfg: Any, checkpoint: str, known: Model | None) -> Model | None:
    """The model a step trains (pretrain), imports (import) or reads (``known``: a model of this file it names,
    else ``checkpoint``, a Hugging Face folder); None for a checkpoint made elsewhere."""
    if stage == "pretrain":
        return Model(step, cfg)
    if stage == "import":
        return hf_model(cfg.source, cfg.pos_encoding or None, step, cfg.data, cfg.max_positions)
    if known is not None or not checkpoint:
        return known
    encoding, folder = parse_reference(checkpoint)
    # Imported on first use with the default data section (checkpoint.imported_copy): plan with that one.
    return hf_model(folder, encoding, checkpoint, DataConfig()) if encoding or is_hf_folder(folder) else None


def hf_model(folder: str, encoding: str | None, step: str, data: DataConfig, max_positions: int = 0) -> Model:
    """The model of the Hugging Face Llama ``folder`` as the import will build it, read from its config.json
    alone, with ``data`` as its own data section; a missing folder is one line."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: no such folder; download the model there first (huggingface-cli "
                                f"download <repo> --local-dir {folder}) or point the variable at its folder")
    model_cfg, _, train_len = hf_model_config(folder, encoding, max_positions)
    return Model(step, PretrainConfig(model=model_cfg, data=data, train_len=train_len))


def searched_lambda_problems(temperature: AttentionTemperature, model: Model | None, search: Search | None,
                             entry: dict, typed: bool) -> None:
    """A searched lambda (``uniform_search``) of a search this file runs (``search``) must come from a search on
    the model this step evaluates (the run refuses another model's) at a length it searches; ``typed``: named by
    the step's ``temperature`` input, not by text."""
    if search is None:
        return
    key, at = ("temperature.search", "temperature.at") if typed else (
        "extension.temperature.uniform_search", "extension.temperature.uniform_search_len")
    if model is not None and search.model is not None and search.model.step != model.step:
        entry["problems"].append(f"{key}: step {search.step!r} searches the model step {search.model.step!r} "
                                 f"trains, this step evaluates the one step {model.step!r} trains; the run refuses "
                                 f"a lambda searched on another model: search this one")
    if temperature.uniform_search_len not in search.targets:
        entry["problems"].append(f"{at}={temperature.uniform_search_len}: step {search.step!r} searches "
                                 f"target_lengths {list(search.targets)}; name one of them")


def shared_out_dirs(steps: list[dict]) -> list[str]:
    """One line per pre-training out_dir two instances would train into (the second would refuse the first's
    checkpoint after the first's compute)."""
    owners: dict[str, str] = {}
    problems = []
    for entry in steps:
        if "out_dir" in entry and entry["out_dir"] in owners:
            problems.append(f"step {entry['id']}: trains into {entry['out_dir']} like step {owners[entry['out_dir']]}; "
                            f"give the step a label, or a name= holding @{{matrix.<key>}} and @{{seed}}, so each instance has its own")
        owners.setdefault(entry.get("out_dir", ""), entry["id"])
    return problems


def run_id_of(checkpoint: str) -> str:
    """``runs:/<run id>/...`` -> the run id; '' for a local folder."""
    return checkpoint.removeprefix("runs:/").split("/")[0] if checkpoint.startswith("runs:/") else ""


def target_problems(entry: dict, model: Model | None, lengths: list[int]) -> None:
    """Target lengths must extend the model and fit it (the stages' own ``check_target_len``)."""
    for length in lengths if model else ():
        try:
            check_target_len(model.cfg, length)
        except ValueError as err:
            entry["problems"].append(f"{err} (model of step {model.step!r})")


def plan_pretrain(cfg: PretrainConfig, model: Model, entry: dict) -> None:
    entry["lengths"] = {"train_len": cfg.train_len}
    try:
        cfg = with_budget(cfg)
    except ValueError as err:
        entry["problems"].append(str(err))
    entry["steps"] = cfg.trainer.max_steps
    entry["out_dir"] = str(output_dir(cfg))
    entry["training_tokens"] = training_tokens(cfg.trainer, cfg.trainer.max_steps, cfg.batch_size, cfg.train_len)
    check_training_data(entry, cfg.data, entry["training_tokens"], cfg.train_len)


def extension_problem(ext, model: Model, entry: dict) -> None:
    """The model config ``evaluate`` will load, ``ext``'s settings on the trained model's (as ``load_model``
    builds it), must be valid: e.g. iRoPE's temperature on a model with no NoPE layer is refused here, before the
    pre-training the evaluation waits for, not after it."""
    # Its tables, fit and searched lambda are artifacts of earlier steps, read only when the step runs: a table
    # stands as a placeholder (what needs one, such as reset_layers, sees it set), the fit as unset, the searched
    # lambda as some lambda != 1 (what needs one, such as past_only, sees it set).
    placeholder = {key: "<an earlier step's table>" if getattr(ext.temperature, key) else ""
                   for key in ("table", "log_slope_table")}
    uniform = SEARCHED_UNIFORM if ext.temperature.uniform_search else ext.temperature.uniform
    temperature = dataclasses.replace(ext.temperature, **placeholder, log_slope_fit="", uniform=uniform,
                                      uniform_search="", uniform_search_len=0)
    settings = {"temperature": temperature, "attention_backend": ext.attention_backend}
    if ext.rope_scaling.method != "none":
        settings["rope_scaling"] = ext.rope_scaling
    try:
        dataclasses.replace(model.cfg.model, **settings)
    except ValueError as err:
        entry["problems"].append(f"{str(err).splitlines()[0]} (model of step {model.step!r})")


def plan_evaluate(cfg, model: Model | None, entry: dict) -> None:
    """Lengths as ``evaluate`` picks them, each plus its generation budget against ``max_positions``."""
    if model is None and (cfg.eval_lengths is None or (cfg.passkey_keys and cfg.passkey_lengths is None)):
        entry["notes"].append("eval_lengths default to multiples of the external model's train_len: unchecked")
        return
    train_len = model.cfg.train_len if model is not None else 0
    lengths, passkey = cfg.perplexity_lengths(train_len), cfg.passkey_lengths_for(train_len)
    longctx = max((answer_tokens(t) for t in cfg.longctx_tasks), default=0) + 1 if cfg.longctx_samples else 0
    entry["lengths"] = {"eval": lengths, "passkey": passkey, "max_new_tokens": cfg.max_new_tokens,
                        "longctx_new_tokens": longctx}
    if model is not None:
        extension_problem(cfg.extension, model, entry)
        limit = model.cfg.model.max_positions
        # evaluate refuses any length + max_new_tokens past the limit; long-context prompts add BOS + answer.
        needed = max([*lengths, *passkey], default=0) + cfg.max_new_tokens
        needed = max(needed, max(passkey, default=0) + longctx)
        if needed > limit:
            entry["problems"].append(f"evaluation needs {needed} positions (longest length + generated tokens), "
                                     f"over max_positions={limit} of the model step {model.step!r} trains; shorten "
                                     f"eval_lengths/passkey_lengths or raise model.max_positions there")
        if not cfg.corpora and lengths:
            check_documents(entry, model.cfg.data, cfg.split, max(lengths))


def plan_scale_search(cfg, model: Model | None, entry: dict) -> None:
    entry["lengths"] = {"targets": list(cfg.target_lengths)}
    target_problems(entry, model, cfg.target_lengths)
    if model is not None:
        check_documents(entry, model.cfg.data, "val", max(cfg.target_lengths))


def plan_headscale(cfg, model: Model | None, entry: dict) -> None:
    entry["lengths"] = {"target_len": cfg.target_len}
    entry["training_tokens"] = training_tokens(cfg.trainer, cfg.steps, cfg.batch_size, cfg.target_len)
    target_problems(entry, model, [cfg.target_len])
    if model is not None:
        check_training_data(entry, model.cfg.data, entry["training_tokens"], cfg.target_len)


def plan_headscale_search(cfg, model: Model | None, entry: dict) -> None:
    plan_headscale(cfg.base, model, entry)
    entry["training_tokens"] *= cfg.num_trials  # at most: pruned trials stop early


def plan_finetune(cfg, model: Model | None, entry: dict) -> None:
    entry["lengths"] = {"target_len": cfg.target_len}
    entry["training_tokens"] = training_tokens(cfg.trainer, cfg.total_steps, cfg.batch_size, cfg.target_len)
    target_problems(entry, model, [cfg.target_len])
    if model is not None:
        try:
            check_rope_model(model.cfg, cfg.checkpoint)
        except ValueError as err:
            entry["problems"].append(str(err))
        check_training_data(entry, model.cfg.data, entry["training_tokens"], cfg.target_len)


def plan_synthetic(cfg: SyntheticConfig | SyntheticGridConfig, model: Model | None, entry: dict) -> None:
    """A synthetic run or grid: its cells (task x PE x seed); ``steps``, the optimizer steps of a cell: one
    number when every cell trains as many, else ``{task: steps}`` (a grid's ``task_overrides``); and per task
    its longest training and test length (the task's own measure, e.g. digits) and the most positions decoding
    a test sequence takes over the seeds, beside that task's ``model.max_positions``. The config already
    refused a sequence that does not fit (each task at its own overrides): this shows the headroom."""
    cells = cfg.cells() if isinstance(cfg, SyntheticGridConfig) else [cfg]
    steps = {cell.task: cell.trainer.max_steps for cell in cells}  # a grid varies them per task only
    entry["cells"] = len(cells)
    entry["steps"] = steps if len(set(steps.values())) > 1 else cells[0].trainer.max_steps
    for cell in cells:
        row = entry["lengths"].setdefault(cell.task, {"train_max": cell.train_max, "test_max": cell.test_max,
                                                      "positions": 0, "max_positions": cell.model.max_positions})
        row["positions"] = max(row["positions"], cell.test_positions[0])


#: Stages checked beyond their config (lengths, budgets, data), each ``(config, model | None, plan entry)``; their
#: result names come from the stages' own declarations (``run.Stage.result_keys``).
CHECKS = {"pretrain": plan_pretrain, "evaluate": plan_evaluate, "scale-search": plan_scale_search,
          "headscale": plan_headscale, "headscale-search": plan_headscale_search, "finetune": plan_finetune,
          "synthetic": plan_synthetic, "synthetic-grid": plan_synthetic}
