"""The study folders (``nope_lightning/results/studies.py``): every folder under experiments/ has a README whose
front matter is a valid card; a card's verdict counts are its report's; the front door's results table is the one
the cards make; the README stays a front door."""

from __future__ import annotations

import re

import pytest

from nope_lightning.results.studies import (
    StudyCard,
    find_studies,
    read_card,
    results_table,
    verdict_counts,
)
from tests.conftest import REPO
from tests.test_readme import cited_tables

STUDIES = find_studies(REPO / "experiments")


def test_every_study_folder_has_a_card_and_its_files():
    assert {s.name for s in STUDIES} == {p.name for p in (REPO / "experiments").iterdir() if p.is_dir()}
    by_name = {s.name: s for s in STUDIES}
    files = {f.path.name: f.seeds for f in by_name["regime_study"].files}
    assert files["regime_study.yaml"] == (1234, 2345, 3456, 4567)
    assert by_name["regime_study"].seeds == tuple(sorted({s for seeds in files.values() for s in seeds}))
    assert by_name["regime_study"].status == "results + bundle" and by_name["small"].status == "results"
    assert by_name["tiny"].status == "no results" and by_name["tiny"].card.wall_clock_min is None
    assert {"synthetic_copy.yaml", "synthetic_parity.yaml"} <= {f.path.name for f in by_name["synthetic"].files}
    for study in STUDIES:
        assert study.files or study.scripts, f"{study.name}: no experiment file or script"


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.name)
def test_a_card_counts_the_verdicts_its_readme_shows_from_its_report(study):
    """The README's claims table is its report's verbatim (test_readme); its verdict cells, counted here, are the
    card's counts (a study whose report tests no claims has none)."""
    readme = study.folder / "README.md"
    shown = "\n".join(table for cited, table in cited_tables(readme) if cited == "results/report.md")
    assert verdict_counts(shown) == study.card.verdicts


def test_the_front_door_is_short_a_first_result_then_one_main_command_and_the_cards_results_table():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    quick_start = text[text.index("## Quick start"):text.index("## Stages")]
    commands = re.findall(r"^nope-lightning run pipeline \S+", quick_start, flags=re.M)
    # the first result comes from the tiny study (a minute); the real job, after it, is the headline study alone
    assert commands[0] == "nope-lightning run pipeline experiments/tiny/tiny.yaml"
    assert set(commands[1:]) == {"nope-lightning run pipeline experiments/regime_study/regime_study.yaml"}
    assert "\npython -m pytest -q -n 2\n" in quick_start  # what .ci/run runs
    assert results_table(STUDIES) in text


def test_verdict_counts_know_partial_and_no_verdict():
    table = ("| claim | verdict |\n|---|---|\n| a | **reproduced** |\n| b | **partial**: +0.549 of the gap, paper "
             "+0.971 |\n| c | **4 seeds: no verdict (fewer than 5)** |\n| d | **1 seed: no verdict about seeds** |\n"
             "| e | **untestable** |\n| f | **13.5 min**, alone |\n| g | **reproduced** |\n"
             "| h | **inconclusive** (new seeds 3, 4, 5 only) |")
    assert verdict_counts(table) == {"reproduced": 2, "partial": 1, "no verdict": 2, "untestable": 1, "inconclusive": 1}
    card = StudyCard("Why?", verdicts={"untestable": 1, "no verdict": 2, "partial": 1, "reproduced": 2})
    assert card.verdict_line() == "2 reproduced, 1 partial, 2 no verdict, 1 untestable"


def test_a_card_is_checked(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("---\nquestion: Why?\nwall_clock_min: 12.5\nmachine: 2 CPU cores\nmeasured: 2026-11-26\n"
                      "verdicts: {reproduced: 2, untestable: 1}\n---\n\n# A study\n")
    card = read_card(readme)
    assert card == StudyCard("Why?", 12.5, "2 CPU cores", "2026-11-26", {"reproduced": 2, "untestable": 1})
    assert card.verdict_line() == "2 reproduced, 1 untestable" and card.time_line() == "12.5 min, 2 CPU cores"
    for front, message in [("question: Why?\nverdicts: {passed: 1}", "unknown verdict"),
                           ("question: Why?\nwall_clock_min: 10", "name its machine"),
                           ("question: Why?\nseeds: 3", "seeds"), ("wall_clock_min: 1\nmachine: x", "question"),
                           ("question: a: b", "not YAML")]:
        readme.write_text(f"---\n{front}\n---\n")
        with pytest.raises(ValueError, match=message):
            read_card(readme)
    readme.write_text("# A study without a card\n")
    with pytest.raises(ValueError, match="no front matter"):
        read_card(readme)


def test_the_seed_count_says_how_many_of_the_files_seeds_have_committed_results(tmp_path):
    import json

    from nope_lightning.results.studies import read_study

    folder = tmp_path / "study"
    (folder / "results/results").mkdir(parents=True)
    (folder / "README.md").write_text("---\nquestion: Does it?\n---\n")
    (folder / "a.yaml").write_text("name: a\nseeds: [1, 2]\nsteps: [{id: e, stage: evaluate}]\n")
    (folder / "b.yaml").write_text("extends: a.yaml\nname: b\nseeds: [3]\n")
    assert read_study(folder).seed_count() == "3"  # no results yet: the files' seeds
    (folder / "results/report.md").write_text("# report\n")
    entries = [{"file": f"x{i}", "run_name": "r", "tags": tags}
               for i, tags in enumerate([{"method": "nope", "seed": "1"}, {"method": "nope", "seed": "2"},
                                         {"method": "nope", "seed": "2"}, {"method": "rope"}])]
    (folder / "results/results/index.json").write_text(json.dumps({"results": entries}))
    study = read_study(folder)
    assert (study.seeds, study.reported_seeds, study.seed_count()) == ((1, 2, 3), (1, 2), "2 of 3")
    # a slice that ran a seed no file lists ("seeds=[4]" on its command line): counted, never "4 of 3"
    entries += [{"file": "x9", "run_name": "r", "tags": {"method": "nope", "seed": "4"}},
                {"file": "x10", "run_name": "r", "tags": {"method": "nope", "seed": "3"}}]
    (folder / "results/results/index.json").write_text(json.dumps({"results": entries}))
    assert read_study(folder).seed_count() == "4"
    (folder / "b.yaml").write_text("extends: a.yaml\nname: b\nseeds: [3, 5]\n")
    assert read_study(folder).seed_count() == "4 of 5"


def test_the_seed_count_reads_every_committed_bundle_and_the_seeds_inside_a_grid(tmp_path):
    """A study that reports its new seeds apart (``results/``) and all its seeds pooled (``all_seeds/``) has
    results of every seed the second holds; a grid placed without a seed tag (it runs its own seeds, a matrix
    of seed pairs) holds the seeds of its cells."""
    import dataclasses

    from nope_lightning.results.bundle import Bundle, Placed
    from nope_lightning.results.runkey import RunKey
    from nope_lightning.results.studies import read_study
    from tests.test_results import CELL, GRID

    def grid(*seeds: int):
        return dataclasses.replace(GRID, runs=[dataclasses.replace(CELL, seed=s) for s in seeds])

    folder = tmp_path / "race"
    folder.mkdir()
    (folder / "README.md").write_text("---\nquestion: Does it?\n---\n")
    (folder / "race.yaml").write_text("name: race\nseeds: [0, 1, 2, 3]\nsteps: [{id: grid, stage: synthetic-grid}]\n")
    (folder / "results").mkdir()
    (folder / "results/report.md").write_text("# report\n")
    key = RunKey("grid", None, (), "synthetic-grid", "grid")
    Bundle([("race", "a")], [None], [Placed(dataclasses.replace(key, seed=3), "g3", grid(3))]).write(
        folder / "results/results")
    assert read_study(folder).seed_count() == "1 of 4"
    Bundle([("race", "a")], [None], [Placed(dataclasses.replace(key, seed=s), f"g{s}", grid(s))
                                     for s in (0, 3)]).write(folder / "all_seeds/results")
    assert read_study(folder).reported_seeds == (0, 3)
    Bundle([("race", "b")], [None], [Placed(key, "pairs", grid(1, 2))]).write(folder / "pairs/results")
    assert (read_study(folder).reported_seeds, read_study(folder).seed_count()) == ((0, 1, 2, 3), "4")
