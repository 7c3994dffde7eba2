"""MLflow: the store, run creation (nested under a pipeline/study parent), and artifact helpers.

Default store ``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` — MLflow 3 refuses a
bare folder store, and Lightning's ``MLFlowLogger`` default (``file:./mlruns``) fails under it, so the URI
is always passed explicitly. Nothing here deletes a run or an artifact.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from nope_lightning.config import TrackingConfig, flatten, to_dict, to_yaml

PARENT_TAG = "mlflow.parentRunId"


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def client(cfg: TrackingConfig):
    """An ``MlflowClient`` on the configured store (its SQLite folder created if needed)."""
    from mlflow.tracking import MlflowClient

    db = _sqlite_path(cfg.uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=cfg.uri)


def experiment_id(cfg: TrackingConfig) -> str:
    """Id of ``cfg.experiment``, created with its artifacts under ``cfg.artifact_root`` if new."""
    mlflow_client = client(cfg)
    exp = mlflow_client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return exp.experiment_id
    location = Path(cfg.artifact_root).resolve() / cfg.experiment
    return mlflow_client.create_experiment(cfg.experiment, artifact_location=location.as_uri())


def run_tags(cfg: TrackingConfig, stage: str) -> dict[str, str]:
    tags = {"stage": stage}
    if cfg.parent_run_id:
        tags[PARENT_TAG] = cfg.parent_run_id
    return tags


def create_run(cfg: TrackingConfig, stage: str, run_name: str, config: Any) -> str:
    """A new run with the stage tag, parent link, flattened params and the resolved config artifact."""
    mlflow_client = client(cfg)
    run = mlflow_client.create_run(experiment_id(cfg), run_name=run_name, tags=run_tags(cfg, stage))
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


def log_metrics(cfg: TrackingConfig, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    import time

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


def download(cfg: TrackingConfig, run_id: str, artifact_path: str, dst: str | Path | None = None) -> Path:
    """Download a run's artifact (file or folder) and return its local path."""
    import mlflow

    dst = Path(dst or tempfile.mkdtemp(prefix="nope_lightning_"))
    os.makedirs(dst, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                    dst_path=str(dst), tracking_uri=cfg.uri))


def lightning_logger(cfg: TrackingConfig, stage: str, run_name: str, run_id: str | None = None):
    """Lightning's ``MLFlowLogger`` on our store; ``run_id`` continues an existing run (resume)."""
    from lightning.pytorch.loggers import MLFlowLogger

    experiment_id(cfg)  # creates the experiment with our artifact location if needed
    return MLFlowLogger(experiment_name=cfg.experiment, run_name=run_name, tracking_uri=cfg.uri,
                        tags=run_tags(cfg, stage), run_id=run_id,
                        artifact_location=(Path(cfg.artifact_root).resolve() / cfg.experiment).as_uri())
