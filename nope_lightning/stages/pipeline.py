"""``pipeline``: run an experiment file — a chain of stages whose outputs feed the next through MLflow.

Every step runs through ``run_stage`` (exactly what its CLI command would run), nested under one parent
MLflow run so the UI compares methods side by side. After a step finishes, its resolved-config hash and
result are logged on the parent as ``steps/<id>.json``; a rerun of the same pipeline (same resolved
pipeline config) finds that parent, skips every step whose hash matches and resumes the first one that
does not — a pretrain killed mid-way continues from its last checkpoint, a scale-search from its study.

Steps run in this process, one after another; a step with ``subprocess: true`` runs as its own
``nope-lightning run`` process instead — required for multi-process strategies (DDP/FSDP), whose launcher
re-executes the command line in every extra rank. Such a step never outlives the pipeline: it runs in its own
process group, which the pipeline kills when it stops on an error or a signal, and on Linux the kernel
kills the step (``PR_SET_PDEATHSIG``) when the pipeline dies by SIGKILL, where no code of ours can run.
Otherwise an orphaned step would keep training into the out_dir that the rerun resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from nope_lightning import tracking
from nope_lightning.config import PipelineConfig, PipelineStep, flatten, to_dict, to_yaml

REFERENCE = re.compile(r"@\{([\w-]+)\.([\w/.-]+)\}")


def resolve_references(text: str, results: dict[str, dict]) -> str:
    """Replace ``@{step.key}`` with ``str(results[step][key])``; a clear error for unknown steps or keys."""
    def substitute(match: re.Match) -> str:
        step, key = match.groups()
        if step not in results:
            raise ValueError(f"@{{{step}.{key}}}: no earlier step {step!r} (steps run in file order)")
        if key not in results[step]:
            raise ValueError(f"@{{{step}.{key}}}: step {step!r} has no result {key!r} "
                             f"(it has {', '.join(sorted(results[step]))})")
        return str(results[step][key])

    return REFERENCE.sub(substitute, text)


def step_config(step: PipelineStep, cfg: PipelineConfig, results: dict[str, dict], parent: str):
    """The validated stage config of ``step``: its YAML <- common overrides (where the key exists) <- its
    overrides with references resolved <- the pipeline's tracking, nested under ``parent``."""
    from nope_lightning.run import get_stage, stage_config

    keys = set(flatten(_defaults(get_stage(step.stage).config_class())))
    common = [o for o in cfg.common if o.split("=", 1)[0] in keys]
    overrides = [resolve_references(o, results) for o in step.overrides]
    t = cfg.tracking
    tracked = [f"tracking.uri={t.uri}", f"tracking.artifact_root={t.artifact_root}",
               f"tracking.experiment={t.experiment}", f"tracking.parent_run_id={parent}"]
    if step.label and "name" in keys:
        tracked.append(f"name={step.label}")
    return stage_config(step.stage, config_path(step.config), [*common, *overrides, *tracked])


def config_path(path: str) -> str | None:
    """A step's YAML: as given if it exists, else relative to the repository (``conf/...`` from anywhere)."""
    if not path or Path(path).exists():
        return path or None
    in_repo = Path(__file__).resolve().parents[2] / path
    return str(in_repo) if in_repo.exists() else path


def _defaults(cls) -> dict:
    """A config class's default values as a nested dict (no validation: required fields may be empty)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cls))


def config_hash(cfg: Any) -> str:
    return hashlib.sha256(to_yaml(cfg).encode()).hexdigest()[:16]


def pipeline_hash(cfg: PipelineConfig) -> str:
    """``config_hash`` of the pipeline less ``dry_run`` (which never reaches a run), so a pipeline started
    before that field existed still finds its parent run to resume."""
    from omegaconf import OmegaConf

    fields = {k: v for k, v in to_dict(cfg).items() if k != "dry_run"}
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(fields)).encode()).hexdigest()[:16]


def find_parent(cfg: PipelineConfig, pipeline_hash: str) -> str | None:
    """The newest parent run of this exact pipeline config, to resume; None if there is none."""
    client = tracking.client(cfg.tracking)
    runs = client.search_runs([tracking.experiment_id(cfg.tracking)],
                              filter_string=f"tags.pipeline_hash = '{pipeline_hash}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def finished_steps(cfg: PipelineConfig, parent: str) -> dict[str, dict]:
    """``step id -> {"hash", "result"}`` of the steps the parent run has recorded as finished."""
    client = tracking.client(cfg.tracking)
    done = {}
    for artifact in client.list_artifacts(parent, "steps"):
        record = json.loads(tracking.download(cfg.tracking, parent, artifact.path).read_text())
        done[record["id"]] = record
    return done


def run(cfg: PipelineConfig) -> dict[str, Any]:
    from nope_lightning.run import get_stage, run_stage

    if cfg.dry_run:
        from nope_lightning.plan import plan

        return plan(cfg)
    for step in cfg.steps:
        get_stage(step.stage)  # unknown stage names fail before anything runs
    run_hash = pipeline_hash(cfg)
    parent = find_parent(cfg, run_hash)
    if parent is None:
        parent = tracking.create_run(cfg.tracking, "pipeline", cfg.name, cfg)
        tracking.client(cfg.tracking).set_tag(parent, "pipeline_hash", run_hash)
    else:
        tracking.claim_run(cfg.tracking, parent)
    done = finished_steps(cfg, parent)
    results: dict[str, dict] = {}
    start = time.perf_counter()
    for number, step in enumerate(cfg.steps, 1):
        stage_cfg = step_config(step, cfg, results, parent)
        digest = config_hash(stage_cfg)
        prefix = f"[{number}/{len(cfg.steps)}] {step.stage} {step.id}"
        if step.id in done and done[step.id]["hash"] == digest:
            results[step.id] = done[step.id]["result"]
            _progress(f"{prefix}: already done, skipped")
            continue
        _progress(f"{prefix}: running ({time.perf_counter() - start:.0f}s elapsed)")
        t0 = time.perf_counter()
        raw = run_subprocess(step.stage, stage_cfg) if step.subprocess else run_stage(step.stage, stage_cfg)
        result = {k: v for k, v in raw.items() if _jsonable(v)}
        results[step.id] = result
        tracking.log_json(cfg.tracking, parent, {"id": step.id, "stage": step.stage, "label": step.label,
                                                 "hash": digest, "result": result}, f"steps/{step.id}.json")
        if "run_id" in result and result["run_id"]:
            client = tracking.client(cfg.tracking)
            client.set_tag(result["run_id"], "pipeline_step", step.id)
            client.set_tag(result["run_id"], "method", step.label or step.id)
        _progress(f"{prefix}: done in {time.perf_counter() - t0:.0f}s")
    summary: dict[str, Any] = {"run_id": parent, "steps": len(cfg.steps),
                               "elapsed_s": round(time.perf_counter() - start, 1)}
    if cfg.report:
        from nope_lightning.config import ReportConfig

        report_cfg = ReportConfig(run=parent, tracking=replace(cfg.tracking, parent_run_id=parent))
        summary["report"] = run_stage("report", report_cfg).get("markdown")
    tracking.end_run(cfg.tracking, parent)
    return summary


def run_subprocess(stage: str, stage_cfg: Any) -> dict[str, Any]:
    """Run one stage as ``python -m nope_lightning.cli run <stage> <resolved.yaml>`` (its output shown as
    usual) in its own process group that dies with this process; the CLI writes its result to
    ``$NOPE_LIGHTNING_RESULT``."""
    import os
    import subprocess
    import tempfile

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
            kill_group(proc)
            raise
        if code or not result.exists():
            raise RuntimeError(f"stage {stage} failed in its subprocess (exit {code}); see its output")
        return json.loads(result.read_text())


def die_with(parent: int):
    """A ``preexec_fn``: the child asks the kernel for SIGKILL when ``parent`` dies (Linux prctl), and
    dies at once if ``parent`` is already gone (the request only covers a death after it)."""
    def request() -> None:
        import ctypes
        import os
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return request


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit`` (their default kills Python without unwinding), so the caller
    can clean up; only the main thread can install handlers, elsewhere nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def kill_group(proc, grace_s: float = 10.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace_s``."""
    import os
    import signal
    import subprocess

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


def _progress(line: str) -> None:
    print(f"pipeline {line}", file=sys.stderr, flush=True)
