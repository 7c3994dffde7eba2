"""MLflow: the store, run creation (nested under a pipeline/study parent), and artifact helpers.

Default store ``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` — MLflow 3 refuses a
bare folder store, and Lightning's ``MLFlowLogger`` default (``file:./mlruns``) fails under it, so the URI
is always passed explicitly. Nothing here deletes a run or an artifact.

Reliability: ``check_store`` (called by ``run_stage`` before any stage) fails in seconds, in one line, when
the store or the artifact root cannot be reached or written, and closes runs whose process died (every run
carries an owner tag: host, pid and the pid's start time; and a machine tag: CPU, torch, threads, GPU). A new
SQLite store's schema is created under a file lock, so processes started together on it do not race MLflow's
migrations. Downloaded artifacts live in one temporary folder per process, removed when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from nope_lightning.config.core import flatten, to_dict, to_yaml
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.runtime import stopping
from nope_lightning.runtime.locks import file_lock
from nope_lightning.runtime.owners import machine, owner, owner_alive

PARENT_TAG = "mlflow.parentRunId"
OWNER_TAG = "nope_lightning.owner"
MACHINE_TAG = "nope_lightning.machine"  # every machine that trained or continued the run, joined by " | "
CONFIG_TAG = "nope_lightning.config_sha"  # the resolved config's sha256 (16 hex digits)
#: MLflow 3's experiment kind: the UI's "Machine learning" kind, as opposed to "GenAI apps & agents". MLflow 3.4
#: and 3.8 (checked) pick an experiment's first page from it (runs here, traces for GenAI); 3.17 follows its
#: sidebar's GenAI / Model training switch instead (docs/mlflow.md).
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
#: While checking a store: no retries, and a short timeout (MLflow's defaults retry for minutes).
CHECK_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_READY: set[str] = set()  # SQLite stores whose schema this process has already seen created
_DOWNLOADS: list[Path] = []  # this process's download folder, created on first use


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def client(cfg: TrackingConfig):
    """An ``MlflowClient`` on the configured store. A SQLite store is created (folder and schema) under a
    lock the first time this process opens it: two processes migrating one new file race and one fails."""
    from mlflow.tracking import MlflowClient

    db = _sqlite_path(cfg.uri)
    if db is None or str(db.resolve()) in _READY:
        return MlflowClient(tracking_uri=cfg.uri)
    with file_lock(f"{db}.lock"):
        mlflow_client = MlflowClient(tracking_uri=cfg.uri)
        mlflow_client.search_experiments(max_results=1)  # builds the store: creates or migrates the schema
    _READY.add(str(db.resolve()))
    return mlflow_client


def experiment_id(cfg: TrackingConfig) -> str:
    """Id of ``cfg.experiment``, created with its artifacts under ``cfg.artifact_root`` if new; marked as a
    model-training experiment (``KIND_TAG``) when created, and when found without a kind (an older store)."""
    from mlflow.exceptions import MlflowException

    mlflow_client = client(cfg)
    db = _sqlite_path(cfg.uri)
    with file_lock(f"{db}.lock") if db is not None else contextlib.nullcontext():
        exp = mlflow_client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            location = Path(cfg.artifact_root).resolve() / cfg.experiment
            try:
                return mlflow_client.create_experiment(cfg.experiment, artifact_location=location.as_uri(),
                                                       tags={KIND_TAG: KIND})
            except MlflowException:  # a process on another host created it first (a server store)
                exp = mlflow_client.get_experiment_by_name(cfg.experiment)
                if exp is None:
                    raise
        if KIND_TAG not in exp.tags:  # a kind chosen in the UI stays
            mlflow_client.set_experiment_tag(exp.experiment_id, KIND_TAG, KIND)
        return exp.experiment_id


def existing_experiment_id(cfg: TrackingConfig) -> str | None:
    """Id of ``cfg.experiment``, or None when the store or the experiment does not exist: a read-only lookup
    (a dry run's), which creates neither the SQLite file nor the experiment."""
    db = _sqlite_path(cfg.uri)
    if db is not None and not db.exists():
        return None
    exp = client(cfg).get_experiment_by_name(cfg.experiment)
    return None if exp is None else exp.experiment_id


# --- fail fast -----------------------------------------------------------------------------------------


def _one_line(err: BaseException) -> str:
    """An exception as one whole line (MLflow and torch messages span lines)."""
    return " ".join(f"{type(err).__name__}: {err}".split())


def _check_writable(folder: Path, what: str) -> None:
    """Create ``folder`` and a file in it, or raise one line. A real write, not ``os.access``: that answers
    yes to root in a read-only folder and knows nothing of read-only mounts."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".nope_lightning_check_"):
            pass
    except OSError as err:
        raise ValueError(f"{what}: cannot write to {folder} ({err.strerror or err}); point it at a writable "
                         f"folder") from None


def _local_path(location: str) -> Path | None:
    """The local folder of an artifact location, or None for a remote one (s3:, mlflow-artifacts:, …)."""
    if location.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(location).path))
    return Path(location) if "://" not in location and ":" not in location.split("/")[0] else None


def tracking_configs(cfg: Any) -> list[TrackingConfig]:
    """Every distinct ``TrackingConfig`` inside a stage config (pipelines and searches nest them)."""
    found: list[TrackingConfig] = []

    def walk(value: Any) -> None:
        if isinstance(value, TrackingConfig):
            if value not in found:
                found.append(value)
        elif dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name))

    walk(cfg)
    return found


def check_store(cfg: Any) -> None:
    """Before a stage does anything: its tracking store answers and is writable, and so is its artifact root;
    raises a one-line ``ValueError`` otherwise (seconds, not MLflow's minutes of retries). Then closes the
    runs of this experiment whose process died (see ``close_dead_runs``).

    A SQLite store's missing folder is created with one line on stderr when the folder above it exists (the
    default ``mlruns/`` of a fresh clone), and refused when that is missing too: most likely a mistyped path,
    which would silently start a new, empty store away from the user's runs.

    A dry run (``cfg.dry_run``) writes nothing to a store, so it checks nothing here: its lookups are read-only
    (``existing_experiment_id``) and dead runs are closed by the next real run."""
    if getattr(cfg, "dry_run", False):
        return
    for tracking_cfg in tracking_configs(cfg):
        db = _sqlite_path(tracking_cfg.uri)
        if db is not None:
            created = not db.parent.exists()
            if created and not db.parent.parent.exists():
                raise ValueError(f"tracking.uri={tracking_cfg.uri}: neither {db.parent} nor {db.parent.parent} "
                                 f"exists; fix the path or create it (mkdir -p {db.parent})")
            _check_writable(db.parent, f"tracking.uri={tracking_cfg.uri}")
            if created:
                print(f"tracking: created {db.parent}/ for the store {tracking_cfg.uri}", file=sys.stderr,
                      flush=True)
            if db.exists() and not os.access(db, os.R_OK | os.W_OK):
                raise ValueError(f"tracking.uri={tracking_cfg.uri}: {db} is not readable and writable")
        try:
            with mock.patch.dict(os.environ, CHECK_ENV):  # restored after, as it was
                exp_id = experiment_id(tracking_cfg)
                location = client(tracking_cfg).get_experiment(exp_id).artifact_location
        except Exception as err:  # noqa: BLE001 — whatever the store raised, it cannot be used
            raise ValueError(f"tracking.uri={tracking_cfg.uri}: the tracking store cannot be used "
                             f"({_one_line(err)})") from None
        folder = _local_path(location)
        if folder is not None:
            _check_writable(folder, f"artifact root of experiment {tracking_cfg.experiment!r} ({location}; "
                                    f"tracking.artifact_root={tracking_cfg.artifact_root})")
        close_dead_runs(tracking_cfg, exp_id)


# --- run ownership: a run whose process died is closed, never left RUNNING -----------------------------


def close_dead_runs(cfg: TrackingConfig, exp_id: str | None = None, *, own: bool = False) -> list[str]:
    """Mark KILLED every RUNNING run of the experiment whose owner process (on this host) has died, and with
    ``own`` every one this process owns (it is stopping); their ids."""
    mlflow_client = client(cfg)
    runs = mlflow_client.search_runs([exp_id or experiment_id(cfg)],
                                     filter_string=f"attributes.status = 'RUNNING' and "
                                                   f"tags.`{OWNER_TAG}` LIKE '{socket.gethostname()}:%'")
    me = owner()
    dead = [r.info.run_id for r in runs
            if (own and r.data.tags[OWNER_TAG] == me) or not owner_alive(r.data.tags[OWNER_TAG])]
    for run_id in dead:
        mlflow_client.set_terminated(run_id, "KILLED")
    return dead


def stop_runs(cfg: Any) -> list[str]:
    """On a stop: mark KILLED the runs of every store in ``cfg`` (a stage config) that this process opened and
    those its killed subprocesses left RUNNING; their ids. A store or experiment that does not exist holds none."""
    stopped = []
    for tracking_cfg in tracking_configs(cfg):
        if (exp_id := existing_experiment_id(tracking_cfg)) is not None:
            stopped += close_dead_runs(tracking_cfg, exp_id, own=True)
    return stopped


def claim_run(cfg: TrackingConfig, run_id: str) -> None:
    """Continue ``run_id`` in this process: RUNNING again, owned by this process."""
    mlflow_client = client(cfg)
    mlflow_client.set_tag(run_id, OWNER_TAG, owner())
    machines = mlflow_client.get_run(run_id).data.tags.get(MACHINE_TAG, "").split(" | ")
    mlflow_client.set_tag(run_id, MACHINE_TAG, " | ".join(dict.fromkeys([*filter(None, machines), machine()])))
    mlflow_client.update_run(run_id, status="RUNNING")


def has_run(cfg: TrackingConfig, run_id: str) -> bool:
    """Whether the store holds ``run_id`` (a folder may remember a run of another store)."""
    from mlflow.exceptions import MlflowException

    try:
        client(cfg).get_run(run_id)
    except MlflowException:
        return False
    return True


def run_tags(cfg: TrackingConfig, stage: str) -> dict[str, str]:
    tags = {"stage": stage, OWNER_TAG: owner(), MACHINE_TAG: machine()}
    if cfg.parent_run_id:
        tags[PARENT_TAG] = cfg.parent_run_id
    return tags


def create_run(cfg: TrackingConfig, stage: str, run_name: str, config: Any) -> str:
    """A new run with the stage tag, parent link, flattened params and the resolved config artifact; or, under a
    pipeline run, this step's run that a stop left KILLED with this same config (``CONFIG_TAG``), continued
    (``claim_run``): a rerun shows one row per step, not one per attempt."""
    mlflow_client, digest = client(cfg), hashlib.sha256(to_yaml(config).encode()).hexdigest()[:16]
    killed = mlflow_client.search_runs([experiment_id(cfg)], (
        f"tags.`{PARENT_TAG}` = '{cfg.parent_run_id}' and tags.stage = '{stage}' and tags.`{CONFIG_TAG}` = "
        f"'{digest}' and attributes.status = 'KILLED'"), max_results=1) if cfg.parent_run_id else []
    if killed:
        claim_run(cfg, killed[0].info.run_id)
        return killed[0].info.run_id
    run = mlflow_client.create_run(experiment_id(cfg), run_name=run_name,
                                   tags={**run_tags(cfg, stage), CONFIG_TAG: digest})
    log_config(cfg, run.info.run_id, config)
    return run.info.run_id


def log_config(cfg: TrackingConfig, run_id: str, config: Any) -> None:
    """Log the resolved config as params (flattened, truncated by MLflow's limit) and ``config.yaml``."""
    from mlflow.entities import Param

    mlflow_client = client(cfg)
    existing = mlflow_client.get_run(run_id).data.params
    params = [Param(k, str(v)[:6000]) for k, v in flatten(to_dict(config)).items() if k not in existing]
    for start in range(0, len(params), 100):
        mlflow_client.log_batch(run_id, params=params[start:start + 100])
    log_text(cfg, run_id, to_yaml(config), "config.yaml")


def log_text(cfg: TrackingConfig, run_id: str, text: str, artifact_file: str) -> None:
    client(cfg).log_text(run_id, text, artifact_file)


def log_json(cfg: TrackingConfig, run_id: str, obj: Any, artifact_file: str) -> None:
    log_text(cfg, run_id, json.dumps(obj, indent=1, default=str), artifact_file)


def log_step_record(cfg: TrackingConfig, pipeline_run: str, record: dict[str, Any]) -> None:
    """Log a pipeline step's record (``id``, ``tags``, ``hash``, ``result``[, ``reused_from``]) on its pipeline
    run, as ``steps/<id>.json``."""
    log_json(cfg, pipeline_run, record, f"steps/{record['id']}.json")


def step_record(cfg: TrackingConfig, pipeline_run: str, instance_id: str) -> dict:
    """The record of step instance ``instance_id`` of a pipeline run (``log_step_record``)."""
    return json.loads(download(cfg, pipeline_run, f"steps/{instance_id}.json").read_text())


def step_records(cfg: TrackingConfig, pipeline_run: str) -> dict[str, dict]:
    """``instance id -> record`` of the steps a pipeline run finished or reused (its ``steps/<id>.json``
    artifacts: id, ``tags`` (its ``RunKey``), step hash, the step's result, whose ``run_id`` names the run the
    step trained or used, and ``reused_from``: the pipeline run it ran under, when that is another)."""
    records = {}
    for artifact in client(cfg).list_artifacts(pipeline_run, "steps"):
        record = json.loads(download(cfg, pipeline_run, artifact.path).read_text())
        records[record["id"]] = record
    return records


def log_metrics(cfg: TrackingConfig, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
    for start in range(0, len(batch), 500):
        client(cfg).log_batch(run_id, metrics=batch[start:start + 500])


def log_artifacts(cfg: TrackingConfig, run_id: str, local_dir: str | Path, artifact_path: str | None = None) -> None:
    client(cfg).log_artifacts(run_id, str(local_dir), artifact_path)


def log_figure(cfg: TrackingConfig, run_id: str, figure, artifact_file: str) -> None:
    """Save a matplotlib figure as a PNG artifact (and close it)."""
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(artifact_file).name
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        parent = str(Path(artifact_file).parent)
        client(cfg).log_artifact(run_id, str(path), None if parent == "." else parent)


def end_run(cfg: TrackingConfig, run_id: str, status: str = "FINISHED") -> None:
    client(cfg).set_terminated(run_id, status)


def _download_root() -> Path:
    """This process's folder for downloads (removed at exit), made on first use; folders left by killed
    processes are removed then too."""
    if not _DOWNLOADS:
        for stale in Path(tempfile.gettempdir()).glob("nope_lightning_*_*"):
            pid = stale.name.split("_")[2]
            if pid.isdigit() and stale.stat().st_uid == os.getuid() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)
        _DOWNLOADS.append(Path(tempfile.mkdtemp(prefix=f"nope_lightning_{os.getpid()}_")))
        atexit.register(shutil.rmtree, _DOWNLOADS[0], True)
    return _DOWNLOADS[0]


def download(cfg: TrackingConfig, run_id: str, artifact_path: str, dst: str | Path | None = None) -> Path:
    """Download a run's artifact (file or folder) and return its local path; a missing run or artifact is
    a one-line ``ValueError``."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if not has_run(cfg, run_id):
        raise ValueError(f"runs:/{run_id}/{artifact_path}: the tracking store {cfg.uri} has no run {run_id} "
                         f"(wrong run id, or a run of another store: set tracking.uri=)")
    dst = Path(dst or tempfile.mkdtemp(dir=_download_root()))
    os.makedirs(dst, exist_ok=True)
    try:
        return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                        dst_path=str(dst), tracking_uri=cfg.uri))
    except (MlflowException, OSError):
        listing = sorted(a.path for a in client(cfg).list_artifacts(run_id))
        raise ValueError(f"runs:/{run_id}/{artifact_path}: run {run_id} has no artifact {artifact_path!r} "
                         f"(it has {', '.join(listing) or 'no artifacts'})") from None


def logged_steps(cfg: TrackingConfig, run_id: str) -> dict[str, int]:
    """``metric -> last step`` already logged in ``run_id``."""
    mlflow_client = client(cfg)
    return {key: max(m.step for m in mlflow_client.get_metric_history(run_id, key))
            for key in mlflow_client.get_run(run_id).data.metrics}


def lightning_logger(cfg: TrackingConfig, stage: str, run_name: str, run_id: str | None = None):
    """Lightning's ``MLFlowLogger`` on our store; ``run_id`` continues an existing run (resume): the run is
    claimed by this process, and a metric point at a step the run already has is not logged again — a
    resumed run recomputes, bit for bit, the steps between its checkpoint and the kill."""
    from lightning.pytorch.loggers import MLFlowLogger

    class ResumingLogger(MLFlowLogger):
        def log_metrics(self, metrics, step=None):
            fresh = {k: v for k, v in metrics.items() if (step or 0) > done.get(k, -1)}
            if fresh:
                super().log_metrics(fresh, step)

        def finalize(self, status: str = "success") -> None:
            # Lightning ends an interrupted fit as "failed"; one stopped by a signal was killed, not broken.
            super().finalize("KILLED" if stopping.received() else status)

    experiment_id(cfg)  # creates the experiment with our artifact location if needed
    done: dict[str, int] = {}
    if run_id is not None:
        claim_run(cfg, run_id)
        done = logged_steps(cfg, run_id)
    return ResumingLogger(experiment_name=cfg.experiment, run_name=run_name, tracking_uri=cfg.uri,
                          tags=run_tags(cfg, stage), run_id=run_id,
                          artifact_location=(Path(cfg.artifact_root).resolve() / cfg.experiment).as_uri())
