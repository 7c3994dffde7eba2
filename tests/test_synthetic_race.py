"""Paper 002's race (conf/synthetic-grid/race.yaml, rule fixed 2026-11-28): the 12 tasks cpu.yaml's recipes learn,
every encoding trained to one stopping rule (validation ID exact match >= 0.99 at 2 validations in a row) under a cap
of 3 x the task's cpu.yaml steps, from the reference's N(0, 1) token embeddings, T5's bias table undecayed, with a
held-out ID test split; and its study (experiments/synthetic_race/race_<task>.yaml), one file a task that runs each
(task, PE) at seeds 0-5, as seed slices (``"seeds=[3]"`` on the command line).
The rule itself (``HeldThreshold``) is tested in tests/test_synthetic_stopping.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from scipy.stats import binomtest

from nope_lightning.analysis.synthetic.attention_claims import ATTENTION_CLAIMS
from nope_lightning.analysis.synthetic.grid import floor_partner
from nope_lightning.config.core import load_config
from nope_lightning.config.parts import ModelConfig, OptimConfig
from nope_lightning.config.synthetic import PAPER_PES, SyntheticConfig, SyntheticGridConfig
from nope_lightning.model.gpt import GPT
from nope_lightning.pipeline.steps import expand, step_config
from nope_lightning.stages import synthetic_grid
from nope_lightning.stages.registry import run_stage, stage_config
from nope_lightning.synthetic import Vocabulary, is_held_out, make_split
from nope_lightning.training.module import CausalLM
from tests.conftest import REPO
from tests.test_synthetic_study import grids

RACE, CPU = REPO / "conf/synthetic-grid/race.yaml", REPO / "conf/synthetic-grid/cpu.yaml"
#: The tasks learned in distribution (validation ID >= 0.9 for >= 4 of the 5 PEs) at cpu.yaml's recipes.
LEARNED = ("copy_repeat", "copy_repeat_2x", "copy_repeat_change", "copy", "copy_2x", "reverse", "reverse_2x",
           "reverse_copy", "sort_symbols", "summation", "parity", "scan")
#: What the race sets for every cell: (stop_at, stop_patience, n_id_test, embedding_init, val_every_n_steps, threads,
#: decay_position_bias).
RULE = (0.99, 2, 400, "t5", 500, 1, False)
NEW_SEEDS, OLD_SEEDS = (3, 4, 5), (0, 1, 2)


def rule(cell: SyntheticConfig) -> tuple:
    return (cell.stop_at, cell.stop_patience, cell.n_id_test, cell.model.embedding_init,
            cell.trainer.val_every_n_steps, cell.trainer.threads, cell.optim.decay_position_bias)


def without_rule(race: SyntheticConfig, cpu: SyntheticConfig) -> SyntheticConfig:
    """``race`` with the race's keys set back to ``cpu``'s values: what else the race would change."""
    return dataclasses.replace(
        race, stop_at=cpu.stop_at, stop_patience=cpu.stop_patience, n_id_test=cpu.n_id_test,
        model=dataclasses.replace(race.model, embedding_init=cpu.model.embedding_init),
        optim=dataclasses.replace(race.optim, decay_position_bias=cpu.optim.decay_position_bias),
        trainer=dataclasses.replace(race.trainer, max_steps=cpu.trainer.max_steps))


@pytest.fixture(scope="module")
def race_cells() -> dict[tuple[str, str], SyntheticConfig]:
    return {(c.task, c.pos_encoding): c for c in load_config(SyntheticGridConfig, RACE, ["seeds=[3]"]).cells()}


def test_the_race_runs_the_learned_tasks_with_the_rule_and_3x_the_steps_and_nothing_else_changed(race_cells):
    cpu = {(c.task, c.pos_encoding): c
           for c in load_config(SyntheticGridConfig, CPU, [f"tasks=[{','.join(LEARNED)}]", "seeds=[3]"]).cells()}
    assert set(race_cells) == {(task, pe) for task in LEARNED for pe in PAPER_PES}
    caps = {task: race_cells[task, "nope"].trainer.max_steps for task in LEARNED}
    assert caps == {**{task: 9000 for task in LEARNED}, "copy_repeat": 6000, "parity": 6000, "summation": 36000}
    for key, cell in race_cells.items():
        assert rule(cell) == RULE, key
        assert cell.trainer.max_steps == 3 * cpu[key].trainer.max_steps, key
        assert without_rule(cell, cpu[key]) == cpu[key], key  # summation keeps its examples and curriculum
    assert rule(cpu["copy", "nope"])[:4] == (0.0, 1, 0, "gpt2")  # cpu.yaml itself is unchanged
    assert cpu["copy", "t5"].optim.decay_position_bias


def test_every_encoding_starts_from_unit_token_embeddings(race_cells):
    vocab = len(Vocabulary.for_task("copy"))
    for pe in PAPER_PES:
        cell = race_cells["copy", pe]
        embeddings = GPT(cell.model, vocab, cell.train_max).transformer.wte.weight
        assert embeddings.std().item() == pytest.approx(1.0, abs=0.05), pe  # 64 x 64 draws: std within ~0.01


@pytest.mark.parametrize("task", LEARNED)
def test_every_race_seed_has_its_held_out_id_test_split(race_cells, task):
    """The split a cell decodes after training (so a problem here would surface only at a cell's end): n_id_test
    examples of held-out problems, none of validation's, at training lengths, for each of the race's 6 seeds."""
    cell = race_cells[task, "nope"]
    for seed in NEW_SEEDS + OLD_SEEDS:
        valid = make_split(task, "valid", cell.n_valid, seed, train_max_len=cell.max_lens[0],
                           test_max_len=cell.max_lens[1])
        split = make_split(task, "id_test", cell.n_id_test, seed, train_max_len=cell.max_lens[0],
                           test_max_len=cell.max_lens[1], avoid=valid)
        prompts = {tuple(e.prompt) for e in split}
        assert len(split) == cell.n_id_test and all(map(is_held_out, prompts))
        assert not prompts & {tuple(e.prompt) for e in valid}
        assert max(e.length for e in split) <= cell.train_max
        if task == "parity":  # 8 bits at most: 400 draws reach nearly every held-out problem (the whole population)
            population = {("parity", ":", *map(str, bits)) for n in range(1, cell.train_max + 1)
                          for bits in itertools.product((0, 1), repeat=n)}
            held_out = {p for p in population if is_held_out(list(p))}
            assert len(held_out) == 43 and prompts <= held_out and len(prompts) >= 0.9 * len(held_out)


def test_the_id_test_split_reads_exact_match_to_five_points():
    """The header's claim: 400 examples give a 95 % Wilson half-width <= 0.05 at the worst case (p = 0.5) and about
    0.03 at the learned floor's neighbourhood (p = 0.9); 200 would not reach 0.05 at p = 0.5."""
    def half_width(k: int, n: int) -> float:
        ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
        return (ci.high - ci.low) / 2

    assert half_width(200, 400) <= 0.05 < half_width(100, 200)
    assert half_width(360, 400) == pytest.approx(0.03, abs=0.002)


def test_a_tiny_race_grid_stops_by_the_rule_or_the_cap_and_says_which(tracking_overrides):
    """copy_repeat at the tiny size under race.yaml's rule, init and split (the split scaled down with the model): the
    logged stop agrees with the rule replayed on the logged validation history."""
    tiny = ["train_max_len=4", "test_max_len=6", "n_train=128", "n_valid=16", "n_test=16", "n_id_test=16",
            "batch_size=16", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.intermediate_size=64",
            "model.max_positions=64", "optim.warmup_steps=2", "trainer.val_every_n_steps=4", "trainer.val_batches=2",
            "eval.batch_size=16"]
    cfg = load_config(SyntheticGridConfig, RACE, [*(f"base.{o}" for o in [*tracking_overrides, *tiny]),
                                                   "tasks=[copy_repeat]", "pos_encodings=[t5]", "seeds=[3]",
                                                   "task_overrides.copy_repeat=[trainer.max_steps=12]"])
    (cell,) = cfg.cells()
    assert rule(cell)[:4] == (0.99, 2, 16, "t5") and cell.trainer.max_steps == 12
    synthetic_grid.run(cfg)
    client = MlflowClient(cell.tracking.uri)
    (child,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                if "stop/step" in r.data.metrics]
    history = [m.value for m in sorted(client.get_metric_history(child.info.run_id, "val/id_acc"),
                                       key=lambda m: m.step)]
    held, stop, met = 0, cell.trainer.max_steps, 0.0  # the rule replayed: the first validation ending 2 >= 0.99
    for i, acc in enumerate(history):
        held = held + 1 if acc >= cell.stop_at else 0
        if held >= cell.stop_patience:
            stop, met = (i + 1) * cell.trainer.val_every_n_steps, 1.0
            break
    metrics = child.data.metrics
    assert (metrics["stop/step"], metrics["stop/rule_met"]) == (stop, met)
    assert len(history) == stop // cell.trainer.val_every_n_steps  # no validation after the stop
    assert "synthetic/copy_repeat/t5/id_test_acc" in metrics


def test_t5_bias_table_leaves_the_decayed_group_only_when_asked():
    """``optim.decay_position_bias``: on (the default, every earlier run's recipe) T5's table is decayed with the
    other matrices; off it joins the norms in the no-decay group and nothing else moves; a model without the table
    gets the same groups either way."""
    def groups(pos_encoding: str, **optim) -> list[set[str]]:
        model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, intermediate_size=32, pos_encoding=pos_encoding),
                    16, 8)
        names = {id(p): n for n, p in model.named_parameters()}
        module = CausalLM(model, OptimConfig(weight_decay=0.05, **optim), max_steps=10)
        found = [{names[id(p)] for p in g["params"]} for g in module.param_groups()]
        assert [g["weight_decay"] for g in module.param_groups()] == [0.05, 0.0]
        return found

    (decayed, kept), (decayed_off, kept_off) = groups("t5"), groups("t5", decay_position_bias=False)
    assert "rel_bias.weight" in decayed and "rel_bias.weight" not in kept
    assert (decayed_off, kept_off) == (decayed - {"rel_bias.weight"}, kept | {"rel_bias.weight"})
    assert "transformer.wte.weight" in decayed_off and "transformer.ln_f.weight" in kept_off
    assert groups("rope") == groups("rope", decay_position_bias=False)
    assert OptimConfig().decay_position_bias


# --- the study files ------------------------------------------------------------------------------------------


FILES = sorted(p for p in (REPO / "experiments/synthetic_race").glob("race_*.yaml")
               if not p.stem.startswith("race_scratchpad_"))
#: The race's scratchpad files: the tasks learned without a scratchpad whose full-format cells fit the CPU budget.
SCRATCHPAD = {task: REPO / f"experiments/synthetic_race/race_scratchpad_{task}.yaml" for task in ("parity", "sort_symbols")}
SEEDS = (0, 1, 2, 3, 4, 5)


def planned_cells(path, overrides: tuple[str, ...] = ()) -> tuple[list[tuple[str, str, int]], list[list[str]]]:
    """The (task, PE, seed) cells a race file runs (one per grid it plans) and its grid steps' overrides, read from
    the pipeline file as it expands (each replicate seed a grid's ``seeds``), without resolving its grids:
    tests/test_golden_step_hashes.py and tests/test_dry_run.py resolve every file, about a second a grid."""
    cfg = stage_config("pipeline", str(path), list(overrides))
    cells, grid_overrides = [], []
    for instance in expand(cfg):
        step = instance.step
        assert step.stage == "synthetic-grid" and step.config == "conf/synthetic-grid/race.yaml", path.name
        grid = OmegaConf.from_dotlist(step.overrides)
        assert set(grid) <= {"tasks", "attention_examples_per_length"}, path.name  # the rule is race.yaml's
        cells += [(task, pe, instance.seed) for task in grid.tasks for pe in PAPER_PES]
        grid_overrides.append(step.overrides)
    return cells, grid_overrides


def test_one_race_file_a_task_runs_each_learned_task_x_5_pes_x_seeds_0_to_5_exactly_once():
    assert [p.stem for p in FILES] == sorted(f"race_{task}" for task in LEARNED)
    seen: dict[tuple[str, str, int], str] = {}
    for path in FILES:
        task = path.stem.removeprefix("race_")
        cells, overrides = planned_cells(path)
        assert stage_config("pipeline", str(path)).seeds == list(SEEDS), path.name
        assert {t for t, _, _ in cells} == {task}, path.name
        # SCAN's file keeps its study file's attention analysis (the claim on NoPE's attention is SCAN's)
        assert all(("attention_examples_per_length=2" in o) == (task == "scan") for o in overrides), path.name
        for cell in cells:
            assert cell not in seen, f"{cell} in {path.name} and {seen[cell]}"
            seen[cell] = path.name
    assert set(seen) == {(t, pe, s) for t in LEARNED for pe in PAPER_PES for s in SEEDS}


def test_a_seed_slice_on_the_command_line_plans_that_seeds_grid_alone(tmp_path, tracking_overrides, monkeypatch):
    """``"seeds=[3]"`` after the file (how the README runs the race) replaces its seeds: one grid, of seed 3 only,
    whose resolved config is the full file's seed-3 grid (the same step hash, so either finds the other's work);
    the dry run plans it without problems, at a sixth of the full file's estimate."""
    path = REPO / "experiments/synthetic_race/race_parity.yaml"
    cells, _ = planned_cells(path, ("seeds=[3]",))
    assert cells == [("parity", pe, 3) for pe in PAPER_PES]
    full, sliced = stage_config("pipeline", str(path)), stage_config("pipeline", str(path), ["seeds=[3]"])
    (instance,) = expand(sliced)
    config = step_config(instance, sliced, {}, "parent")
    assert config.seeds == [3] and config == step_config(expand(full)[SEEDS.index(3)], full, {}, "parent")
    monkeypatch.setenv("NOPE_LIGHTNING_CACHE", str(tmp_path / "cache"))

    def plan(*overrides: str) -> dict:
        return run_stage("pipeline", stage_config("pipeline", str(path), [*overrides, *tracking_overrides,
                                                                          "dry_run=true"]))

    one, every = plan("seeds=[3]"), plan()
    assert one["problems"] == [] and [s["id"] for s in one["steps"]] == ["grid[seed=3]"]
    assert one["estimate_s"] == pytest.approx(every["estimate_s"] / len(SEEDS), rel=1e-3)


def scratchpad_cells(path, overrides: tuple[str, ...] = ()) -> list[SyntheticConfig]:
    return [cell for _, grid in grids(path, overrides) for cell in grid.cells()]


def test_the_scratchpad_files_run_both_formats_x_5_pes_x_the_new_seeds_at_the_race_cells_recipe(race_cells):
    """The pre-registered scratchpad claims' cells: full and minimal x the 5 PEs x seeds 3-5, each the race's
    no-scratchpad cell of its (task, PE) (the pair the claims compare) but for its format and positions, and the
    longest full scratchpad fits those positions."""
    assert sorted(SCRATCHPAD.values()) == sorted((REPO / "experiments/synthetic_race").glob("race_scratchpad_*.yaml"))
    for task, path in SCRATCHPAD.items():
        cells = scratchpad_cells(path)
        assert sorted((c.scratchpad, c.pos_encoding, c.seed) for c in cells) == sorted(
            itertools.product(("full", "minimal"), PAPER_PES, NEW_SEEDS)), path.name
        for c in cells:
            none = dataclasses.replace(race_cells[task, c.pos_encoding], seed=c.seed)
            assert dataclasses.replace(c, scratchpad="none", model=none.model) == none, (path.name, c.pos_encoding)
            assert dataclasses.replace(c.model, max_positions=none.model.max_positions) == none.model
            assert rule(c) == RULE and c.test_positions[0] <= c.model.max_positions == 1024


def test_a_pe_slice_of_a_scratchpad_file_plans_those_pes_cells_as_the_whole_file_does():
    path = SCRATCHPAD["sort_symbols"]
    whole = {(c.scratchpad, c.pos_encoding, c.seed): c for c in scratchpad_cells(path)}
    sliced = scratchpad_cells(path, ("seeds=[4]", "matrix.scratchpad=[full]", 'common=["pos_encodings=[t5,rope]"]'))
    assert [(c.scratchpad, c.pos_encoding, c.seed) for c in sliced] == [("full", "t5", 4), ("full", "rope", 4)]
    assert all(c == whole[c.scratchpad, c.pos_encoding, c.seed] for c in sliced)


def test_the_cap_study_trains_the_six_missed_cells_again_at_twice_the_cap_and_the_race_rule_otherwise(race_cells):
    """The exploratory cap study (experiments/synthetic_race_cap/): its three README slices plan exactly the six
    (task, PE, seed) cells the race missed at its cap, each the race's cell but for a cap of 18,000 steps."""
    path = REPO / "experiments/synthetic_race_cap/race_cap.yaml"
    slices = [(), ('common=["tasks=[reverse_copy]", "pos_encodings=[t5,rope]"]',),
              ("seeds=[4]", 'common=["tasks=[reverse]", "pos_encodings=[rope]"]')]
    cells = [cell for overrides in slices for _, grid in grids(path, overrides) for cell in grid.cells()]
    assert sorted((c.task, c.pos_encoding, c.seed) for c in cells) == sorted([
        ("copy_2x", "sinusoidal", 5), ("reverse_2x", "sinusoidal", 5), ("reverse_copy", "sinusoidal", 5),
        ("reverse_copy", "t5", 5), ("reverse_copy", "rope", 5), ("reverse", "rope", 4)])
    for c in cells:
        race = dataclasses.replace(race_cells[c.task, c.pos_encoding], seed=c.seed)
        assert race.trainer.max_steps == 9000 and rule(c) == RULE
        assert c == dataclasses.replace(race, trainer=dataclasses.replace(race.trainer, max_steps=18000))


def test_the_floor_study_trains_the_race_s_scan_nope_cells_two_neighbouring_seeds_a_grid(race_cells):
    """The exploratory floor study (experiments/synthetic_race_floor/): its three README slices plan NoPE alone on
    scan at seeds 0-5, each cell the race's, two neighbouring seeds a grid (the second seed's floor is the first's
    NoPE), analysed as the race's scan file analyses its cells."""
    race = grids(REPO / "experiments/synthetic_race/race_scan.yaml")[0][1]
    path = REPO / "experiments/synthetic_race_floor/race_floor_scan.yaml"
    planned = [grid for pair in ("0,1", "2,3", "4,5") for _, grid in grids(path, (f'matrix={{pair: ["{pair}"]}}',))]
    assert [grid for _, grid in grids(path)] == planned  # the whole file: the three slices, one after another
    assert [grid.seeds for grid in planned] == [[0, 1], [2, 3], [4, 5]]
    assert [floor_partner(grid.seeds, grid.seeds[1]) for grid in planned] == [0, 2, 4]
    for grid in planned:
        assert (grid.attention_examples_per_length, grid.distance_bins) == (
            race.attention_examples_per_length, race.distance_bins) == (2, 20)
        for cell in grid.cells():
            assert cell == dataclasses.replace(race_cells["scan", "nope"], seed=cell.seed)


POOLED, NEW_REPORT = REPO / "experiments/synthetic_race/all_seeds", REPO / "experiments/synthetic_race/results"


def claim_rows(report: Path) -> dict[str, list[str]]:
    """The claims table of a committed report: claim text -> its cells."""
    text = (report / "report.md").read_text()
    table = text[text.index("| claim | rule |"):].split("\n\n")[0].splitlines()[2:]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split(" | ")] for line in table)}


def test_the_pooled_report_holds_the_new_seed_report_whole_and_judges_its_new_seeds_as_that_report_does():
    """all_seeds/ pools seeds 0-2's slices with results/'s: its bundle holds every run and result file of results/'s,
    byte for byte (a pooled report made again from its own bundle reads the same new-seed cells), and every claim
    whose rule changed since the first study has a *new seeds only* cell there that gives the verdict results/ gives
    it (for a pre-registered claim, which reads seeds 3-5 alone in both, its own verdict). A rule never changed (the
    attention claim's) saw no seed before it was fixed: every seed is new to it, 0-2 too, so its cell says so."""
    new, pooled = (json.loads((r / "results/index.json").read_text()) for r in (NEW_REPORT, POOLED))
    assert {tuple(p) for p in new["pipelines"]} < {tuple(p) for p in pooled["pipelines"]}
    for entry in new["results"]:
        assert (POOLED / "results" / entry["file"]).read_bytes() == (NEW_REPORT / "results" / entry["file"]).read_bytes()
    seeds = {int(e["tags"]["seed"]) for e in pooled["results"]}
    assert seeds - {int(e["tags"]["seed"]) for e in new["results"]} <= set(OLD_SEEDS) and seeds >= set(NEW_SEEDS)
    judged, pooled_rows = claim_rows(NEW_REPORT), claim_rows(POOLED)
    assert judged.keys() == pooled_rows.keys()
    unchanged = {c.text for c in ATTENTION_CLAIMS if not c.changes}
    for claim, cells in pooled_rows.items():
        verdict = judged[claim][-1].split("**")[1]
        fresh = cells[-3]
        if claim in unchanged:
            read = int(cells[6].split(", ")[1].split()[0])  # "1 task, 4 queries": one query a (task, seed)
            assert fresh == f"as pooled: all {read} seeds ran after the rule", claim
        elif fresh.startswith("as pooled"):  # every seed it read is new: its verdict is the new seeds'
            assert cells[-1].split("**")[1] == verdict, claim
        else:
            assert fresh.startswith(f"**{verdict}** on seeds 3, 4, 5"), claim


def test_the_scratchpad_errors_study_trains_the_race_s_parity_scratchpad_cells_again():
    """The exploratory scratchpad-errors study (experiments/synthetic_race_scratchpad/): the whole file and its
    README's slices plan exactly the race's parity scratchpad cells (full and minimal x 5 PEs x seeds 3-5), each
    config equal to the race's, so its cells differ from the race's only by the machine that trains them."""
    path = REPO / "experiments/synthetic_race_scratchpad/race_scratchpad_errors.yaml"
    race = {(c.scratchpad, c.pos_encoding, c.seed): c for c in scratchpad_cells(SCRATCHPAD["parity"])}
    whole = scratchpad_cells(path)
    assert sorted((c.scratchpad, c.pos_encoding, c.seed) for c in whole) == sorted(race)
    assert all(c == race[c.scratchpad, c.pos_encoding, c.seed] for c in whole)
    slices = [("seeds=[3]", "matrix.scratchpad=[full]"), ("seeds=[4]", "matrix.scratchpad=[full]"),
              ("seeds=[5]", "matrix.scratchpad=[full]", 'common=["pos_encodings=[nope,t5,alibi]"]'),
              ("seeds=[5]", "matrix.scratchpad=[full]", 'common=["pos_encodings=[rope,sinusoidal]"]')]
    sliced = [c for overrides in slices for c in scratchpad_cells(path, overrides)]
    assert sorted((c.pos_encoding, c.seed) for c in sliced) == sorted((pe, s) for f, pe, s in race if f == "full")
    assert all(c == race[c.scratchpad, c.pos_encoding, c.seed] for c in sliced)


def test_the_scratchpad_errors_study_holds_the_race_s_own_parity_scratchpad_models():
    """Its committed cells are the race's committed parity scratchpad cells to the example (the same stop, selected
    step, held-out ID and per-example OOD answers), so where their outputs go wrong is where the race's did; and
    every one of them recorded where each wrong OOD output first departs from its target."""
    from nope_lightning.results.bundle import Bundle

    def cells(folder: str) -> dict:
        return {(c.scratchpad, c.pos_encoding, c.seed): c for p in Bundle.read(REPO / folder).results
                for c in p.result.runs if c.task == "parity" and c.scratchpad != "none"}

    race, again = cells("experiments/synthetic_race/results/results"), cells(
        "experiments/synthetic_race_scratchpad/results/results")
    assert sorted(again) == sorted(race) and len(again) == 30
    for key, c in again.items():
        assert (c.steps, c.best_step, c.id_test_acc, c.ood_correct, c.test_digest) == (
            race[key].steps, race[key].best_step, race[key].id_test_acc, race[key].ood_correct, race[key].test_digest)
        assert sum(map(len, c.scratchpad_errors.values())) == c.ood_correct.count(False) > 0
