"""A synthetic grid's ``task_overrides``: ``key=value`` overrides of ``base`` for one task's cells only,
merged and checked as the config system merges a command line; a key the grid sets per cell is refused; a grid
without them builds the cells, and has the hash, it had before they existed (so its finished cells are found
on resume); the pipeline dry run shows the steps per task and checks each task's positions at its own
overrides."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from nope_lightning.config.core import load_config, to_dict
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig
from nope_lightning.pipeline.steps import expand, identity, step_config, step_hash
from nope_lightning.stages.registry import run_stage, stage_config
from nope_lightning.stages.synthetic_grid import cell_key
from nope_lightning.synthetic.tasks import TASKS as TASK_NAMES
from tests.conftest import REPO
from tests.test_synthetic_pipeline import SEED, pipeline_file

TINY = REPO / "conf/synthetic/tiny.yaml"
TASKS, PES, SEEDS = ["copy_repeat", "reverse"], ["nope", "alibi"], [0, 1]


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory) -> Path:
    """copy_repeat and reverse x (NoPE, ALiBi) x seeds 0, 1 at the tiny size (lengths 4 -> 6, 8 steps)."""
    path = tmp_path_factory.mktemp("grid") / "grid.yaml"
    path.write_text(yaml.safe_dump({"tasks": TASKS, "pos_encodings": PES, "seeds": SEEDS,
                                    "base": yaml.safe_load(TINY.read_text())}))
    return path


def old_cells(grid: SyntheticGridConfig, parent: str) -> list[SyntheticConfig]:
    """The cells as grids built them before ``task_overrides``: ``base`` with each task, PE and seed."""
    return [grid.base.cell(task, pe, seed, parent) for task in grid.tasks for seed in grid.seeds
            for pe in grid.pos_encodings]


def test_a_grid_without_overrides_builds_the_cells_and_hash_it_did_before(grid_file):
    grid = load_config(SyntheticGridConfig, grid_file)
    assert grid.task_overrides == {}
    cells = grid.cells("parent")
    assert cells == old_cells(grid, "parent")
    assert [cell_key(c) for c in cells] == [f"{t}/{pe}/s{s}" for t in TASKS for s in SEEDS for pe in PES]
    # The hash by which a rerun finds its parent run: the whole config as it was, without the new fields.
    before = {k: v for k, v in to_dict(grid).items() if k != "task_overrides"}
    for key in ("curriculum_steps", "stop_at", "stop_patience", "n_id_test"):
        del before["base"][key]
    del before["base"]["model"]["embedding_init"]
    del before["base"]["trainer"]["checkpoint_minutes"]
    del before["base"]["optim"]["decay_position_bias"]
    digest = hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert grid.config_hash == digest
    # ... and the pipeline step's identity (by which a pipeline finds its finished grid step) leaves the empty
    # field out, as it leaves out every field added later at its default; set, the field changes it
    assert "task_overrides" not in identity(grid)
    with_overrides = load_config(SyntheticGridConfig, grid_file, ["task_overrides.reverse=[trainer.max_steps=20]"])
    assert identity(with_overrides)["task_overrides"] == {"reverse": ["trainer.max_steps=20"]}
    assert step_hash(with_overrides) != step_hash(grid)


@pytest.mark.parametrize("overrides", [
    ["task_overrides={reverse: [trainer.max_steps=20, model.n_layer=3]}"],  # as a grid file writes it
    ["task_overrides.reverse=[trainer.max_steps=20,model.n_layer=3]"],  # on a command line
])
def test_overrides_reach_only_their_task_s_cells(grid_file, overrides):
    plain = load_config(SyntheticGridConfig, grid_file)
    grid = load_config(SyntheticGridConfig, grid_file, overrides)
    base = grid.base
    reverse = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, max_steps=20),
                                  model=dataclasses.replace(base.model, n_layer=3))
    assert grid.cells("p") == [(reverse if task == "reverse" else base).cell(task, pe, seed, "p")
                               for task in TASKS for seed in SEEDS for pe in PES]
    assert grid.cells("p")[:4] == plain.cells("p")[:4]  # copy_repeat's cells as without overrides
    assert [cell_key(c) for c in grid.cells()] == [cell_key(c) for c in plain.cells()]
    assert grid.config_hash != plain.config_hash  # another recipe: another parent run


def test_an_override_of_a_task_outside_the_grid_stays_unused(grid_file):
    """One grid file holds every task's recipe; a study picks its tasks: the other tasks' overrides are kept, unused
    (their values not checked: pcfg's n_layer=0 would fail on pcfg, and is never merged here)."""
    plain = load_config(SyntheticGridConfig, grid_file)
    grid = load_config(SyntheticGridConfig, grid_file, ["task_overrides.pcfg=[trainer.max_steps=9,model.n_layer=0]"])
    assert grid.cells("p") == plain.cells("p") and grid.task_base("reverse") == plain.base
    with pytest.raises(ValueError, match="task_overrides.pcfg: model.n_layer=0 is out of range"):
        load_config(SyntheticGridConfig, grid_file, ["tasks=[pcfg]", "task_overrides.pcfg=[model.n_layer=0]"])


@pytest.mark.parametrize("override, message", [
    ("trainer.max_stepz=9", "config key 'trainer.max_stepz': Key 'max_stepz' not in 'TrainerConfig'. Did you mean: "
                            "'max_steps'?"),
    ("trainer.max_steps=many", "config key 'trainer.max_steps': Value 'many' of type 'str' could not be converted "
                               "to Integer"),
])
def test_a_misspelt_or_mistyped_override_of_a_task_outside_the_grid_fails_before_compute(grid_file, override,
                                                                                          message):
    # a typo in the recipe of a task the study does not run yet must not wait for the study that does
    assert "pcfg" not in load_config(SyntheticGridConfig, grid_file).tasks
    with pytest.raises(ValueError) as err:
        load_config(SyntheticGridConfig, grid_file, [f"task_overrides.pcfg=[{override}]"])
    assert str(err.value) == f"task_overrides.pcfg: {message}"


@pytest.mark.parametrize("override, message", [
    ("task_overrides.pcfgg=[trainer.max_steps=9]",
     "task_overrides names unknown tasks: pcfgg; known: " + ", ".join(TASK_NAMES)),
    ("task_overrides.reverse=[trainer.max_stepz=9]",
     "task_overrides.reverse: config key 'trainer.max_stepz': Key 'max_stepz' not in 'TrainerConfig'. "
     "Did you mean: 'max_steps'?"),
    ("task_overrides.reverse=[trainer.max_steps=many]",
     "task_overrides.reverse: config key 'trainer.max_steps': Value 'many' of type 'str' could not be "
     "converted to Integer"),
    ("task_overrides.reverse=[trainer.max_steps=0]",
     "task_overrides.reverse: trainer.max_steps=0 is out of range: it must be >= 1"),
    ("task_overrides.reverse=[trainer.max_steps]",
     "task_overrides.reverse: overrides must look like key=value, got: trainer.max_steps"),
    ("task_overrides.reverse=[task=copy]",
     "task_overrides.reverse: 'task=copy' sets a key the grid sets for every cell; set tasks instead"),
    ("task_overrides.reverse=[pos_encoding=rope]",
     "task_overrides.reverse: 'pos_encoding=rope' sets a key the grid sets for every cell; set pos_encodings "
     "instead"),
    ("task_overrides.reverse=[model.pos_encoding=rope]",
     "task_overrides.reverse: 'model.pos_encoding=rope' sets a key the grid sets for every cell; set "
     "pos_encodings instead"),
    ("task_overrides.reverse=[seed=3]",
     "task_overrides.reverse: 'seed=3' sets a key the grid sets for every cell; set seeds instead"),
    ("task_overrides.reverse=[name=mine]",
     "task_overrides.reverse: 'name=mine' sets a key the grid sets for every cell; set name instead"),
    ("task_overrides.reverse=[tracking.uri=file:elsewhere]",
     "task_overrides.reverse: 'tracking.uri=file:elsewhere' sets a key the grid sets for every cell; set "
     "base.tracking instead"),
    *((f"task_overrides.{task}=[{override}]",
       f"task_overrides.{task}: '{override}' changes the task's format (its input, answer, lengths or scoring), "
       f"which a recipe may not; set base.{override.split('=')[0]} for the whole grid, as a study of that format")
      for task, override in (("reverse", "scratchpad=full"), ("pcfg", "scratchpad=full"),
                             ("addition", "train_max_len=4"), ("copy", "test_max_len=60"),
                             ("parity", "eval.bucket_width=2"))),
])
def test_a_bad_override_fails_in_one_line_naming_the_fix(grid_file, override, message):
    with pytest.raises(ValueError) as err:
        load_config(SyntheticGridConfig, grid_file, [override])
    assert str(err.value) == message


@pytest.fixture
def track(tmp_path: Path) -> TrackingConfig:
    return TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts"))


def dry_run(tmp_path: Path, track: TrackingConfig, *overrides: str) -> dict:
    """The dry run of ``pipeline_file``'s one grid step on copy_repeat and reverse, with the step's
    ``overrides``."""
    path = pipeline_file(tmp_path, track, overrides=("tasks=[copy_repeat,reverse]", *overrides))
    return run_stage("pipeline", stage_config("pipeline", str(path), ["dry_run=true"]))


def test_the_dry_run_shows_the_steps_per_task(tmp_path, track):
    (entry,) = dry_run(tmp_path, track, "task_overrides.reverse=[trainer.max_steps=20]")["steps"]
    assert (entry["cells"], entry["steps"], entry["problems"]) == (4, {"copy_repeat": 8, "reverse": 20}, [])
    # Without overrides every cell trains conf/synthetic/tiny.yaml's 8 steps: one number, as before.
    assert dry_run(tmp_path, track)["steps"][0]["steps"] == 8


def test_a_device_override_reaches_one_task_through_the_files_common_overrides(tmp_path, track):
    """A study file's recipe for one task changed from the command line (a GPU's larger recipe, the file unchanged):
    ``task_overrides`` is an open mapping, so ``common`` reaches it; that task's cells take it, the others keep theirs."""
    path = pipeline_file(tmp_path, track, overrides=("tasks=[copy_repeat,reverse]",),
                         common=["task_overrides.reverse=[trainer.max_steps=20,batch_size=16]"])
    cfg = stage_config("pipeline", str(path), ["dry_run=true"])
    (instance,) = expand(cfg)
    grid = step_config(instance, cfg, {}, "parent")
    assert grid.task_overrides == {"reverse": ["trainer.max_steps=20", "batch_size=16"]}
    cells = {(c.task, c.pos_encoding): c for c in grid.cells("parent")}
    assert (cells["reverse", "nope"].batch_size, cells["copy_repeat", "nope"].batch_size) == (16, grid.base.batch_size)
    (entry,) = run_stage("pipeline", cfg)["steps"]
    assert entry["steps"] == {"copy_repeat": 8, "reverse": 20}


@pytest.mark.parametrize("override, message", [
    ("task_overides.reverse=[trainer.max_steps=20]",
     "common override 'task_overides.reverse=[trainer.max_steps=20]': no step of this file has the key "
     "'task_overides.reverse' (stages: synthetic-grid)"),
    ("trainer.max_steps=20", "common override 'trainer.max_steps=20': no step of this file has the key "
                             "'trainer.max_steps' (stages: synthetic-grid); did you mean 'base.trainer.max_steps'?"),
])
def test_a_common_override_no_step_takes_fails_the_dry_run_in_one_line(tmp_path, track, override, message):
    path = pipeline_file(tmp_path, track, common=[override])
    with pytest.raises(ValueError) as err:
        run_stage("pipeline", stage_config("pipeline", str(path), ["dry_run=true"]))
    assert str(err.value).splitlines()[1:] == [message]


def test_an_override_past_max_positions_fails_the_dry_run_naming_the_task(tmp_path, track):
    # reverse's longest test sequence (length 6) takes 17 positions: at its own max_positions=17 it fits
    # (copy_repeat keeps base's 64), at 16 it fails.
    entry = dry_run(tmp_path, track, "task_overrides.reverse=[model.max_positions=17]")["steps"][0]
    assert entry["lengths"]["reverse"] == {"train_max": 4, "test_max": 6, "positions": 17,
                                           "max_positions": 17}
    assert entry["lengths"]["copy_repeat"]["max_positions"] == 64
    with pytest.raises(ValueError) as err:
        dry_run(tmp_path, track, "task_overrides.reverse=[model.max_positions=16]")
    heading, *lines = str(err.value).splitlines()
    assert heading == "dry run of pipeline 'synthetic': 1 problem(s):"
    assert lines == [f"step grid[seed={SEED}]: task_overrides.reverse: task 'reverse' with scratchpad=none: "
                     f"the longest test sequence (length 6: <bos> prompt <sep> target <eos>, plus "
                     f"eval.extra_new_tokens=0) needs model.max_positions >= 17, not 16; raise "
                     f"model.max_positions or lower test_max_len"]
