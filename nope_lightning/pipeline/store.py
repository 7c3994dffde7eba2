"""What the store already holds of a pipeline: its parent run, and the finished run of a step's hash under any
pipeline run. The real run (``runner.run``) resumes and reuses through these lookups; the dry run reads them to mark
the steps a run would skip (``finished_steps``), and writes nothing: a store or experiment that does not exist yet
has finished nothing, and is not created to find that out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nope_lightning.config.core import load_config
from nope_lightning.config.pipeline import PipelineConfig
from nope_lightning.pipeline.inputs import as_inputs
from nope_lightning.pipeline.steps import Instance, pipeline_hash, recorded_hash, step_config, step_hash
from nope_lightning.runtime import tracking

#: The tag holding a step's hash (``steps.step_hash``) on the run it started: how any later pipeline finds it.
HASH_TAG = "config_hash"


def find_parent(cfg: PipelineConfig, run_hash: str) -> str | None:
    """The newest parent run of this exact pipeline config, to resume; None if there is none. A parent run of the
    file's name whose logged file is this one once text references and typed inputs are read alike
    (``inputs.as_inputs``) is this pipeline too: the same file before its references became typed inputs (the
    position of a reference among the overrides, which typed inputs do not have, changed its ``pipeline_hash``)."""
    client = tracking.client(cfg.tracking)
    runs = client.search_runs([tracking.experiment_id(cfg.tracking)],
                              filter_string=f"tags.pipeline_hash = '{run_hash}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if runs:
        return runs[0].info.run_id
    same = typed_hash(cfg)
    named = client.search_runs([tracking.experiment_id(cfg.tracking)],
                               filter_string=f"tags.stage = 'pipeline' and attributes.run_name = '{cfg.name}'",
                               order_by=["attributes.start_time DESC"])
    for run in named:
        try:
            logged = load_config(PipelineConfig, tracking.download(cfg.tracking, run.info.run_id, "config.yaml"))
        except (ValueError, OSError):  # a file the code no longer reads (or no file) is no match
            continue
        if typed_hash(logged) == same:
            return run.info.run_id
    return None


def typed_hash(cfg: PipelineConfig) -> str:
    """``pipeline_hash`` of ``cfg`` with its text references that typed inputs stand for made typed inputs."""
    return pipeline_hash(replace(cfg, steps=[as_inputs(step) for step in cfg.steps]))


def finished_step(cfg: PipelineConfig, digest: str) -> dict[str, Any] | None:
    """The step record (``result``, and ``parent``: the pipeline run it ran under) of the newest FINISHED run
    of the experiment tagged with step hash ``digest``, under any pipeline run; None if there is none."""
    client = tracking.client(cfg.tracking)
    runs = client.search_runs([tracking.experiment_id(cfg.tracking)],
                              filter_string=f"tags.{HASH_TAG} = '{digest}' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None
    tags = runs[0].data.tags
    owner = tags[tracking.PARENT_TAG]
    record = tracking.step_record(cfg.tracking, owner, tags["pipeline_step"])
    # The pipeline run may have rerun that instance since with another config: its record says so.
    return {"result": record["result"], "parent": owner} if record["hash"] == digest else None


def finished_steps(cfg: PipelineConfig, instances: list[Instance], planned: dict[str, Any],
                   stand_in_parent: str) -> dict[str, str]:
    """``instance id -> what the store holds of it`` for the instances a run of ``cfg`` would not run: done under
    this file's parent run, or finished under another pipeline run (reused). The instances resolve in order as the
    run resolves them: a step found finished hands its recorded results to the later ones (so their configs, and
    hashes, are the real ones); one that is not keeps its ``planned`` placeholders (``stand_in_parent``: the parent
    id the placeholders were resolved under, when the store holds no parent run of this file)."""
    if tracking.existing_experiment_id(cfg.tracking) is None:
        return {}
    parent = find_parent(cfg, pipeline_hash(cfg))
    done = tracking.step_records(cfg.tracking, parent) if parent else {}
    results, found = dict(planned), {}
    for instance in instances:
        stage_cfg = step_config(instance, cfg, results, parent or stand_in_parent)
        digest = step_hash(stage_cfg)
        if instance.id in done and done[instance.id]["hash"] in (digest, recorded_hash(stage_cfg)):
            results[instance.id] = done[instance.id]["result"]
            found[instance.id] = f"done under this file's pipeline run {parent}"
        elif (hit := finished_step(cfg, digest)) is not None:
            results[instance.id] = hit["result"]
            found[instance.id] = f"finished under pipeline run {hit['parent']}, would be reused"
    return found
