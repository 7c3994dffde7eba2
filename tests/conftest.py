"""Shared fixtures: single-threaded torch, no stop carried over between tests, and tracking pointed at a temporary
SQLite store."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def load_script(path: str) -> ModuleType:
    """The script at ``path`` (relative to the repository, e.g. ``tools/parallel_slices.py``: not a package module)
    imported as the module named by its stem, registered in ``sys.modules`` (its dataclasses need it); the caller
    removes it when done."""
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _unstopped():
    """Each test starts as a fresh command would: no stop signal recorded by an earlier test that signalled this
    process (a recorded stop makes a run end KILLED and a command exit 128 + the signal)."""
    from nope_lightning.runtime import stopping

    stopping.begin()


@pytest.fixture
def tracking_overrides(tmp_path: Path) -> list[str]:
    """``key=value`` overrides that keep a run's MLflow store out of the repo's ``mlruns/``."""
    return [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_root={tmp_path}/artifacts"]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    """One prepared-data cache per test session (the tiny corpus tokenises in about a second)."""
    return str(tmp_path_factory.mktemp("data_cache"))


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory, data_cache) -> dict:
    """A NoPE model pretrained once per session on the tiny config; its result has ``model`` (export
    folder) and ``tracking`` (the ``key=value`` overrides of its private MLflow store)."""
    from nope_lightning.stages.registry import run_stage, stage_config

    root = tmp_path_factory.mktemp("tiny_pretrained")
    tracking = [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts"]
    cfg = stage_config("pretrain", str(REPO / "conf/pretrain/tiny.yaml"),
                       [*tracking, f"data.cache_dir={data_cache}", f"out_dir={root}/run", "trainer.progress_bar=false",
                        "trainer.max_steps=40"])
    return {**run_stage("pretrain", cfg), "tracking": tracking}
