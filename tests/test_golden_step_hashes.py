"""Every committed study file resolves to the step hashes and pipeline hash recorded in
``tests/data/golden_step_hashes.json``: a step's hash is how a store finds its finished run, and a pipeline's how a
rerun finds its parent run, so a refactor of step resolution (the links between steps, ``ADDED_FIELDS``, the config
layers) that moved either would rerun finished work or lose a study's parent run.

Each file is expanded as the run and its dry run expand it (``steps.expand``, ``steps.step_config``), with
deterministic stand-ins for the results of earlier steps (``FakeResults``: a run id is the md5 of its instance id),
the environment variables the files read set to fixed values, and the files' own tracking settings: the hashes
depend on the files and the code alone. To record a change of hashes that is meant (a new field that is not in ``ADDED_FIELDS`` changes every
step it reaches): ``python -m tests.test_golden_step_hashes``, and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from nope_lightning.pipeline.steps import expand, pipeline_hash, step_config, step_hash
from nope_lightning.stages.registry import stage_config
from tests.conftest import REPO

GOLDEN = REPO / "tests/data/golden_step_hashes.json"
#: Fixed values for the environment variables study files read (paper.yaml's corpora, the released checkpoints).
ENVIRONMENT = {"CORPUS": "/data/slimpajama", "PG19": "/data/pg19", "PROOFPILE": "/data/proofpile",
               "NOPE_1B": "/models/nope-1.1b", "HEADSCALE_8K": "/models/nope-headscale8k", "ROPE_1B": "/models/rope-1.1b"}
PARENT = "golden-parent"  # the pipeline run every step is nested under (a step hash leaves it out)


def study_files() -> list[Path]:
    """The committed pipeline files (``experiments/<study>/*.yaml`` with ``steps`` or ``extends``), sorted."""
    return [path for path in sorted((REPO / "experiments").glob("*/*.yaml"))
            if {"steps", "extends"} & set(yaml.safe_load(path.read_text()))]


class FakeResults(dict):
    """Stand-ins for every result of instance ``instance``: its run id the md5 of the instance id (32 hex, as an
    MLflow run id), any other key a path naming both."""

    def __init__(self, instance: str):
        super().__init__()
        self.run_id = hashlib.md5(instance.encode()).hexdigest()

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> Any:
        return self.run_id if key == "run_id" else f"/fake/{self.run_id}/{key}"


def hashes(path: Path) -> dict[str, Any]:
    """``{"pipeline_hash": ..., "steps": {instance id: step hash}}`` of the study file ``path``, run order."""
    cfg = stage_config("pipeline", str(path))
    results: dict[str, FakeResults] = {}
    steps = {}
    for instance in expand(cfg):
        steps[instance.id] = step_hash(step_config(instance, cfg, results, PARENT))
        results[instance.id] = FakeResults(instance.id)
    return {"pipeline_hash": pipeline_hash(cfg), "steps": steps}


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def every_file() -> dict[str, dict[str, Any]]:
    """``hashes`` of every study file, by path relative to the repository, the files spread over the machine's
    cores (a synthetic grid's config takes about a second to validate, and there are 25 grid files)."""
    files = study_files()
    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("fork")) as pool:
        return dict(zip(map(relative, files), pool.map(hashes, files), strict=True))


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def computed() -> dict[str, dict[str, Any]]:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENVIRONMENT.items():
            patch.setenv(key, value)
        return every_file()


def test_the_golden_file_covers_every_committed_study_file(golden):
    assert sorted(golden) == [relative(p) for p in study_files()]
    assert sum(len(entry["steps"]) for entry in golden.values()) > 300


@pytest.mark.parametrize("path", study_files(), ids=lambda p: p.stem)
def test_a_study_file_resolves_to_its_recorded_hashes(path, golden, computed):
    got, want = computed[relative(path)], golden[relative(path)]
    changed = [i for i in want["steps"] if got["steps"].get(i) != want["steps"][i]]
    assert list(got["steps"]) == list(want["steps"]), "the file's instances changed"
    assert not changed, f"{len(changed)} step hash(es) changed, e.g. {changed[0]}: a store's finished runs of " \
                        f"them would rerun (a new schema field belongs in steps.ADDED_FIELDS)"
    assert got["pipeline_hash"] == want["pipeline_hash"], "a rerun would not find the file's parent run"


def test_the_stand_ins_make_the_hashes_depend_on_the_run_ids_of_earlier_steps(monkeypatch):
    """A step that reads an earlier step's run gets another hash when that run differs: the stand-ins reach the
    configs (a constant stand-in would hide a link resolved to the wrong step)."""
    path = REPO / "experiments/tiny/tiny.yaml"
    monkeypatch.setattr(FakeResults, "__missing__", lambda self, key: "another-run-id" if key == "run_id" else "x")
    other = hashes(path)["steps"]
    monkeypatch.undo()
    same = hashes(path)["steps"]
    assert other["pretrain_nope"] == same["pretrain_nope"] and other["eval_nope"] != same["eval_nope"]


if __name__ == "__main__":
    os.environ.update(ENVIRONMENT)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(every_file(), indent=1) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
