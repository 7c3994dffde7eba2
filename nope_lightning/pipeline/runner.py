"""``pipeline``: run an experiment file — a chain of stages whose outputs feed the next through MLflow.

The file's steps are expanded into instances (``steps.py``: one per replicate seed and matrix point), every one
of which is first resolved and checked exactly as the dry run does (``dry_run.py``), so a bad reference, length or
token budget anywhere stops the run before any compute. Each instance then runs through ``run_stage``
(exactly what its CLI command would run), nested under one parent MLflow run so the UI compares methods side by
side, tagged with its ``RunKey`` (method, seed, matrix point, stage, step) and its step hash (``steps.step_hash``:
the resolved config less the parent run). After an instance finishes, its hash and result are logged on the parent
as ``steps/<instance id>.json``. A finished step never runs twice: a rerun of the same pipeline finds that parent
and skips every instance whose hash matches; an instance whose hash names a FINISHED run of any other pipeline run
(the same file with more seeds, another file sharing a model) reuses it and records the reuse on this parent,
whose report then includes it. The first instance found neither way resumes — a pretrain killed mid-way
continues from its last checkpoint, a scale-search from its study.

Steps run in this process, one after another; a step with ``subprocess: true`` runs as its own
``nope-lightning run`` process instead — required for multi-process strategies (DDP/FSDP), whose launcher
re-executes the command line in every extra rank. Such a step never outlives the pipeline: it runs in its own
process group, which the pipeline kills when it stops on an error or a signal, and on Linux the kernel
kills the step (``PR_SET_PDEATHSIG``) when the pipeline dies by SIGKILL, where no code of ours can run.
Otherwise an orphaned step would keep training into the out_dir that the rerun resumes.

Ctrl-C or SIGTERM stops the pipeline in one line naming the step and what its rerun resumes, with every run it
opened marked KILLED (``runtime/stopping.py``, the CLI); a rerun continues the KILLED runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from nope_lightning.config.core import to_yaml
from nope_lightning.config.pipeline import PipelineConfig, ReportConfig
from nope_lightning.pipeline import dry_run
from nope_lightning.pipeline.eta import StudyClock
from nope_lightning.pipeline.steps import expand, pipeline_hash, recorded_hash, step_config, step_hash
from nope_lightning.pipeline.store import HASH_TAG, find_parent, finished_step
from nope_lightning.runtime import stopping, tracking
from nope_lightning.runtime.progress import pipeline_line
from nope_lightning.runtime.stopping import signals_raise
from nope_lightning.stages.registry import run_stage


def run(cfg: PipelineConfig) -> dict[str, Any]:
    if cfg.dry_run:
        return dry_run.plan(cfg)
    # Every instance resolved and checked (problems stop the run before compute), and its cost estimated:
    clock = StudyClock(dry_run.plan(cfg, quiet=True)["steps"])
    instances = expand(cfg)
    run_hash = pipeline_hash(cfg)
    parent = find_parent(cfg, run_hash)
    if parent is None:
        parent = tracking.create_run(cfg.tracking, "pipeline", cfg.name, cfg)
        tracking.client(cfg.tracking).set_tag(parent, "pipeline_hash", run_hash)
    else:
        tracking.claim_run(cfg.tracking, parent)
        # What the file says only to the report (claims, references, labels' paper rows) may have changed since:
        # the report reads the logged config.yaml, so it is the file as run now (logged params keep their values).
        tracking.log_config(cfg.tracking, parent, cfg)
    done = tracking.step_records(cfg.tracking, parent)
    results: dict[str, dict] = {}
    start = time.perf_counter()
    for number, instance in enumerate(instances, 1):
        step, key = instance.step, instance.key
        stage_cfg = step_config(instance, cfg, results, parent)
        digest = step_hash(stage_cfg)
        prefix = f"[{number}/{len(instances)}] {step.stage} {instance.id}"
        record = {"id": instance.id, "tags": key.tags(), "hash": digest}
        if instance.id in done and done[instance.id]["hash"] in (digest, recorded_hash(stage_cfg)):
            results[instance.id] = done[instance.id]["result"]
            clock.skipped(number - 1)
            pipeline_line(f"{prefix}: already done, skipped")
            continue
        if (found := finished_step(cfg, digest)) is not None:
            results[instance.id] = found["result"]
            tracking.log_step_record(cfg.tracking, parent,
                                     {**record, "result": found["result"], "reused_from": found["parent"]})
            clock.skipped(number - 1)
            pipeline_line(f"{prefix}: finished under pipeline run {found['parent']}, reused")
            continue
        pipeline_line(f"{prefix}: running; {clock.status()}")
        t0 = time.perf_counter()
        stopping.at(f"step {number} of {len(instances)} ({step.stage} {instance.id})")
        raw = run_subprocess(step.stage, stage_cfg) if step.subprocess else run_stage(step.stage, stage_cfg)
        result = {k: v for k, v in raw.items() if _jsonable(v)}
        results[instance.id] = result
        tracking.log_step_record(cfg.tracking, parent, {**record, "result": result})
        client = tracking.client(cfg.tracking)
        # Only a run this step started is tagged: a run it continued (a finished model found by name) keeps the
        # place and hash its own pipeline gave it, which that pipeline's report and reuse rely on.
        if result.get("run_id") and client.get_run(result["run_id"]).data.tags.get(tracking.PARENT_TAG) == parent:
            for name, value in {**key.tags(), HASH_TAG: digest}.items():
                client.set_tag(result["run_id"], name, value)
        pipeline_line(f"{prefix}: {clock.finished(number - 1, time.perf_counter() - t0)}")
    summary: dict[str, Any] = {"run_id": parent, "steps": len(instances),
                               "elapsed_s": round(time.perf_counter() - start, 1)}
    if cfg.report:
        report_cfg = ReportConfig(run=parent, claims=list(cfg.claims), sweep=dict(cfg.sweep),
                                  bootstrap=cfg.bootstrap, tracking=replace(cfg.tracking, parent_run_id=parent))
        summary["report"] = run_stage("report", report_cfg).get("markdown")
    tracking.end_run(cfg.tracking, parent)
    return summary


def run_subprocess(stage: str, stage_cfg: Any) -> dict[str, Any]:
    """Run one stage as ``python -m nope_lightning.cli run <stage> <resolved.yaml>`` (its output shown as
    usual) in its own process group that dies with this process; the CLI writes its result to
    ``$NOPE_LIGHTNING_RESULT``."""
    with tempfile.TemporaryDirectory() as tmp:
        path, result = Path(tmp) / f"{stage}.yaml", Path(tmp) / "result.json"
        path.write_text(to_yaml(stage_cfg))
        linux = sys.platform.startswith("linux")
        proc = subprocess.Popen([sys.executable, "-m", "nope_lightning.cli", "run", stage, str(path)],
                                env={**os.environ, "NOPE_LIGHTNING_RESULT": str(result)}, start_new_session=True,
                                preexec_fn=die_with(os.getpid()) if linux else None)
        try:
            with signals_raise():
                code = proc.wait()
        except BaseException:
            with stopping.shielded():
                kill_group(proc)
            if result.exists():  # a step stopped by the signal says what its rerun resumes
                stopping.STATE.note = json.loads(result.read_text()).get("stopped", "")
            raise
        if code or not result.exists():
            raise RuntimeError(f"stage {stage} failed in its subprocess (exit {code}); see its output")
        return json.loads(result.read_text())


def die_with(parent: int):
    """A ``preexec_fn``: the child asks the kernel for SIGKILL when ``parent`` dies (Linux prctl), and
    dies at once if ``parent`` is already gone (the request only covers a death after it)."""
    def request() -> None:
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return request


def kill_group(proc, grace_s: float = 10.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace_s`` (a stopped step
    ends its fit at the next step and marks its runs KILLED; runs a SIGKILL leaves RUNNING are closed by the
    pipeline's own stop, ``tracking.stop_runs``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader is gone; anything it started gets no grace
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return


def _jsonable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: PipelineConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the pipeline run, its instance count and wall clock (s), and the report's file."""
    return {"run_id": str, "steps": int, "elapsed_s": float, **({"report": str} if cfg.report else {})}
