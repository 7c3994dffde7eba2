"""The study's result index (``results/index.py``): places keyed by ``RunKey``, views in the order filed, a second
result at a place refused naming both sources, seeds kept as ints."""

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest

from nope_lightning.analysis.sources import Item, gather
from nope_lightning.results import ResultIndex
from nope_lightning.results.bundle import INDEX
from nope_lightning.results.runkey import RunKey
from tests.conftest import REPO


def test_a_place_is_stage_point_method_and_seed_not_the_step():
    index = ResultIndex()
    place = index.add(RunKey("nope", 5, (("n_layer", "2"),), "evaluate", step="eval_nope"), "r", "store a")
    assert place == RunKey("nope", 5, (("n_layer", "2"),), "evaluate")
    assert list(index) == [place]
    # Another step filing the same method at the same place is the same place: refused.
    with pytest.raises(ValueError, match=r"^store a and store b both hold evaluate 'nope' seed 5: report each "
                                         r"alone, or drop one from also$"):
        index.add(RunKey("nope", 5, (("n_layer", "2"),), "evaluate", step="eval_nope_again"), "r2", "store b")
    # Another stage, point or seed is another place.
    index.add(RunKey("nope", 5, (("n_layer", "2"),), "scale-search"), "s", "store b")
    index.add(RunKey("nope", 5, (("n_layer", "4"),), "evaluate"), "r4", "store b")
    index.add(RunKey("nope", None, (("n_layer", "2"),), "evaluate"), "r0", "store b")
    assert len(list(index)) == 4


def test_one_source_filing_a_place_twice_is_refused_too():
    """A rerun step whose first run also left a result: which one counts is not left to run order."""
    index = ResultIndex()
    index.add(RunKey("nope", 1, (), "evaluate"), "first", "pipeline run x")
    with pytest.raises(ValueError, match="pipeline run x and pipeline run x both hold evaluate 'nope' seed 1"):
        index.add(RunKey("nope", 1, (), "evaluate"), "second", "pipeline run x")


def test_views_are_plain_dicts_in_the_order_filed():
    index = ResultIndex()
    p, q = (("n_layer", "4"),), (("n_layer", "2"),)
    for method, seed, point, stage in [("rope", 2, p, "evaluate"), ("nope", 2, q, "evaluate"),
                                       ("nope", 1, p, "evaluate"), ("rope", 1, p, "evaluate"),
                                       ("nope", 1, q, "scale-search"), ("nope", 3, p, "evaluate")]:
        index.add(RunKey(method, seed, point, stage), f"{stage}:{method}:{seed}:{point[0][1]}", "s")
    by_point = index.stage("evaluate")
    assert type(by_point) is dict and type(by_point[p]) is dict and type(by_point[p]["rope"]) is dict
    assert list(by_point) == [p, q]
    assert list(by_point[p]) == ["rope", "nope"]  # rope filed first at p
    assert list(by_point[p]["rope"].items()) == [(2, "evaluate:rope:2:4"), (1, "evaluate:rope:1:4")]
    assert list(by_point[p]["nope"]) == [1, 3]
    assert index.at("evaluate", q) == {"nope": {2: "evaluate:nope:2:2"}}
    assert index.at("scale-search", p) == {} and index.at("headscale", q) == {} and index.stage("headscale") == {}
    assert index.points("evaluate") == [p, q] and index.points("scale-search") == [q]
    assert index.points("scale-search", "evaluate") == [p, q]
    assert index.results("evaluate") == ["evaluate:rope:2:4", "evaluate:rope:1:4", "evaluate:nope:1:4",
                                         "evaluate:nope:3:4", "evaluate:nope:2:2"]


@pytest.mark.parametrize("study", ["headscale_retrieval", "hybrids", "regime_study"])  # synthetic: below
def test_a_committed_bundle_indexed_reads_as_the_nested_point_method_seed_dicts_did(study):
    """The order a report's tables follow: the index's views equal ``point -> method -> seed`` dicts filled
    entry by entry, as the report grouped results before the index (the bundle's own entries and tags)."""
    entries = json.loads((REPO / "experiments" / study / "results" / "results" / INDEX).read_text())["results"]
    index, nested = ResultIndex(), defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for entry in entries:
        key = RunKey.from_tags(entry["tags"], entry["run_name"])
        index.add(key, entry["file"], "bundle")
        nested[key.stage][key.point][key.method][key.seed] = entry["file"]
    for stage, by_point in nested.items():
        view = index.stage(stage)
        assert view == by_point
        assert [(p, m, list(s)) for p, b in view.items() for m, s in b.items()] == \
            [(p, m, list(s)) for p, b in by_point.items() for m, s in b.items()]
    assert {key.seed for key in index} <= {None} | {int(e["tags"]["seed"]) for e in entries if "seed" in e["tags"]}
    assert all(key.seed is None or type(key.seed) is int for key in index)


def test_a_seed_stays_an_int():
    """A seed read as a tag's text is refused: ``"7"`` and ``7`` would be two places and print alike."""
    index = ResultIndex()
    with pytest.raises(TypeError, match="seed '7' is a str, not an int; read it through RunKey.from_tags"):
        index.add(RunKey("nope", "7", (), "evaluate"), "r", "s")
    with pytest.raises(TypeError, match="seed True is a bool"):
        index.add(RunKey("nope", True, (), "evaluate"), "r", "s")
    place = index.add(RunKey.from_tags({"method": "nope", "seed": "7", "stage": "evaluate"}), "r", "s")
    assert place.seed == 7 and type(place.seed) is int
    assert index.at("evaluate", ()) == {"nope": {7: "r"}}


def test_grids_of_different_tasks_or_pes_at_one_place_are_two_results_the_same_grid_twice_is_refused(tmp_path):
    """One file a task: every task's grid is step ``grid`` at point () and seed 0; its cells tell them apart, and
    so do they for one task's PEs run as slices (``pos_encodings=[...]`` on the command line)."""
    def grid(*cells):
        return SimpleNamespace(runs=[SimpleNamespace(task=t, scratchpad=p, pos_encoding=pe) for t, p, pe in cells])

    def source(label, *grids):
        key = RunKey("grid", 0, (), "synthetic-grid", "grid")
        return SimpleNamespace(label=label, steps=frozenset(), items=lambda: iter([Item(key, "g", label, g) for g in grids]))

    parity, copy = grid(("parity", "none", "nope"), ("parity", "none", "t5")), grid(("copy_repeat", "none", "nope"))
    found = gather([source("file a", parity), source("file b", copy)], tmp_path, [])
    assert found.results.results("synthetic-grid") == [parity, copy]
    assert [key.point for key in found.results] == [(("cells", "parity/none/nope,parity/none/t5"),),
                                                    (("cells", "copy_repeat/none/nope"),)]
    assert [p.key.point for p in found.placed] == [(), ()]  # the bundle keeps each run's own key
    with pytest.raises(ValueError, match="file a and file b both hold synthetic-grid 'grid' seed 0"):
        gather([source("file a", parity), source("file b", grid(("parity", "none", "t5"), ("parity", "none", "nope")))],
               tmp_path, [])
    rope = grid(("parity", "none", "rope"))  # the same (task, seed)'s other PEs: a slice of its own
    assert gather([source("file a", parity), source("slice", rope)], tmp_path, []).results.results(
        "synthetic-grid") == [parity, rope]
