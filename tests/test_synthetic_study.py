"""Paper 002's CPU study files (experiments/synthetic/synthetic_<task>.yaml, one per task, and
synthetic_scratchpad_*.yaml, over the per-task recipes of conf/synthetic-grid/cpu.yaml) and tools/parallel_slices.py,
which runs their slices side by side: every one of the paper's 17 tasks has a file running it x 5 PEs x 3 seeds at
its recipe, and a slice (one matrix point and seed, in its own store) trains exactly the cells the whole file trains
at that point."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from nope_lightning.config.synthetic import PAPER_PES
from nope_lightning.pipeline.steps import expand, step_config
from nope_lightning.stages.registry import stage_config
from nope_lightning.synthetic.tasks import TASKS
from tests.conftest import REPO, load_script

FILES = {task: REPO / f"experiments/synthetic/synthetic_{task}.yaml" for task in TASKS}
#: The scratchpad study, one file per task (the others extend parity's steps; each runs whole or as its slices): the four tasks
#: the second edition's claim needs at least, and LEGO.
SCRATCHPAD = {task: REPO / f"experiments/synthetic/synthetic_scratchpad_{task}.yaml"
              for task in ("addition", "parity", "summation", "sort_symbols", "lego")}
#: The tasks whose file runs one grid of the 3 seeds with the attention analysis (its floor pairs seeds in a grid).
ATTENTION = ("scan", "pcfg")
#: Each task's recipe: (steps, training examples, examples a step, curriculum steps).
RECIPES = {**{task: (3000, 20_000, 32, 0) for task in TASKS}, "copy_repeat": (2000, 20_000, 32, 0),
           "parity": (2000, 20_000, 32, 0), "addition": (4000, 20_000, 32, 0),
           "summation": (12_000, 200_000, 32, 10_000)}


def recipe(cell) -> tuple[int, int, int, int]:
    return cell.trainer.max_steps, cell.n_train, cell.batch_size, cell.curriculum_steps


@pytest.fixture(scope="module")
def slicer():
    yield load_script("tools/parallel_slices.py")
    del sys.modules["parallel_slices"]


def grids(path: Path, overrides: tuple[str, ...] = ()):
    """Every grid the pipeline file runs: ``(instance, SyntheticGridConfig)``, tracking left at the file's."""
    cfg = stage_config("pipeline", str(path), list(overrides))
    return [(inst, step_config(inst, cfg, {}, parent="p")) for inst in expand(cfg)]


def without_tracking(grid):
    """``grid`` with its store replaced by one fixed store (the only setting a slice changes)."""
    store = dataclasses.replace(grid.base.tracking, uri="sqlite:///x.db", artifact_root="x")
    return dataclasses.replace(grid, base=dataclasses.replace(grid.base, tracking=store))


@pytest.mark.parametrize("task", TASKS)
def test_each_task_file_runs_its_task_x_5_pes_x_3_seeds_at_its_recipe(task):
    planned = grids(FILES[task])
    cells = [cell for _, grid in planned for cell in grid.cells()]
    assert {(c.task, c.pos_encoding, c.seed) for c in cells} == {(task, pe, s) for pe in PAPER_PES for s in (0, 1, 2)}
    assert len(cells) == len(PAPER_PES) * 3
    assert all(recipe(c) == RECIPES[task] and c.scratchpad == "none" for c in cells)
    assert all(c.trainer.threads == 1 for c in cells)  # two files share 2 cores
    if task in ATTENTION:
        assert [(g.tasks, g.seeds, g.attention_examples_per_length) for _, g in planned] == [([task], [0, 1, 2], 2)]
    else:
        assert [g.seeds for _, g in planned] == [[0], [1], [2]]


def test_every_task_of_the_paper_has_one_file():
    assert len(TASKS) == 17 and all(path.is_file() for path in FILES.values())


def test_the_scratchpad_files_run_full_and_minimal_for_nope_and_t5_and_fit_their_longest_scratchpad():
    for task, path in SCRATCHPAD.items():
        assert {c.task for _, grid in grids(path) for c in grid.cells()} == {task}
    cells = [cell for path in SCRATCHPAD.values() for _, grid in grids(path) for cell in grid.cells()]
    assert {(c.task, c.scratchpad, c.pos_encoding, c.seed) for c in cells} == {
        (t, s, pe, seed) for t in SCRATCHPAD for s in ("full", "minimal") for pe in ("nope", "t5")
        for seed in (0, 1, 2)}
    assert all(recipe(c) == RECIPES[c.task] for c in cells)  # in every format
    assert max(c.test_positions[0] for c in cells) <= 1024 == cells[0].model.max_positions


def test_a_slice_trains_the_cells_the_whole_file_trains_at_its_point(slicer, tmp_path):
    slices = slicer.slices(str(FILES["copy_repeat"]), tmp_path)
    assert [Path(s["folder"]).name for s in slices] == [
        "synthetic_copy_repeat-s0", "synthetic_copy_repeat-s1", "synthetic_copy_repeat-s2"]
    whole = {(inst.point, inst.seed): without_tracking(grid) for inst, grid in grids(FILES["copy_repeat"])}
    for entry in slices:
        ((inst, grid),) = grids(Path(entry["file"]), tuple(entry["overrides"]))
        assert grid.base.tracking.uri == f"sqlite:///{entry['folder']}/mlflow.db"
        assert without_tracking(grid) == whole[(inst.point, inst.seed)]
    # A file without replicate seeds: one slice, its steps' own seeds.
    scan = slicer.slices(str(FILES["scan"]), tmp_path)
    assert [Path(s["folder"]).name for s in scan] == ["synthetic_scan"]
    assert not any(o.startswith("seeds=") for o in scan[0]["overrides"])


def test_a_report_over_slices_is_titled_by_the_study_and_counts_its_runs_and_files():
    from nope_lightning.analysis.report_frame import heading

    slices = [("synthetic_parity", "a"), ("synthetic_scan", "b"), ("synthetic_parity", "c")]
    assert heading(slices).startswith("# Report: synthetic\n\nRead from 3 pipeline runs of 2 experiment "
                                      "files;")
    assert heading([("tiny", "a")]).startswith("# Report: tiny\n\nRead from 1 pipeline run of 1 experiment "
                                               "file;")


def test_one_report_reads_a_task_study_beside_a_scratchpad_study_of_the_same_task(tmp_path):
    """Their grids share (step id, seed) and the first file's matrix keys name only the task: each grid keeps its
    whole point, so parity without a scratchpad and with the full one are two grids, not a duplicate."""
    import yaml

    from nope_lightning.stages.registry import run_stage

    base = {**yaml.safe_load((REPO / "conf/synthetic/tiny.yaml").read_text()), "log_model": False, "task": "parity"}
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"tasks": ["parity"], "pos_encodings": ["nope"], "seeds": [0],
                                    "attention_examples_per_length": 0, "base": base}))
    step = {"id": "grid", "stage": "synthetic-grid", "config": str(grid), "overrides": ["tasks=[@{matrix.task}]"]}
    padded = {**step, "overrides": [*step["overrides"], "base.scratchpad=@{matrix.scratchpad}",
                                    "base.model.max_positions=256"]}
    runs = []
    for name, matrix, the_step in (("tasks", {"task": ["parity"]}, step),
                                   ("pads", {"task": ["parity"], "scratchpad": ["full"]}, padded)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "seeds": [0], "matrix": matrix, "steps": [the_step],
                                        "report": False}))
        runs.append(run_stage("pipeline", stage_config("pipeline", str(path), [
            f"tracking.uri=sqlite:///{tmp_path}/{name}.db", f"tracking.artifact_root={tmp_path}/{name}"]))["run_id"])
    report = run_stage("report", stage_config("report", None, [
        f"run={runs[0]}", f"tracking.uri=sqlite:///{tmp_path}/tasks.db", f"out_dir={tmp_path / 'report'}",
        f"also=[{{run: {runs[1]}, uri: 'sqlite:///{tmp_path}/pads.db'}}]"]))
    text = Path(report["markdown"]).read_text()
    assert "| parity | 0 |" in text and "| parity (full) | 0 |" in text
