"""Shared fixtures: single-threaded torch, and tracking pointed at a temporary SQLite store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


@pytest.fixture
def tracking_overrides(tmp_path: Path) -> list[str]:
    """``key=value`` overrides that keep a run's MLflow store out of the repo's ``mlruns/``."""
    return [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_root={tmp_path}/artifacts"]
