"""The results home (``nope_lightning/results``): every result type round-trips through its on-disk JSON form,
reads the files written before results carried a ``version`` (the committed reports were made from such files),
refuses a newer version in one line, and is the only reader of a result file in the package."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from nope_lightning.config.synthetic import PAPER_PES
from nope_lightning.results import (
    BucketAccuracy,
    ConvergedEntropy,
    Curve,
    EvaluationResult,
    Failure,
    HeadEntropy,
    HeadScaleResult,
    LogFit,
    PasskeyCell,
    PasskeyOutcome,
    PasskeyResults,
    Perplexity,
    PositionBest,
    PositionCurves,
    ScaleSearchResult,
    ScoredWindows,
    SearchSamples,
    SearchTrial,
    SelectionIntervals,
    SyntheticCell,
    SyntheticGridResult,
    TaskAttention,
)
from nope_lightning.results.bundle import Bundle, Placed, Recipe
from nope_lightning.results.runkey import RunKey
from tests.conftest import REPO

CURVE = Curve([3.0, 3.5], [2.9, 3.4], [3.1, 3.6], [[300.0, 700.0], [310.0, 690.0]])
EVALUATION = EvaluationResult(
    train_len=64, corpora=["tiny"], setting="lam1.2", split="test", lengths=[64, 128], stride=8, bootstrap=100,
    temperature_table=[[1.0, 1.2]],
    ppl={"tiny": {64: Perplexity(30.0, math.log(30.0), 512, 3.3, 3.5), 128: Perplexity(40.0, 3.69, 512, 3.6, 3.8)}},
    windows={"tiny": ScoredWindows([0, 0, 1], [70, 78, 90], {64: [[10.0, 8.0]] * 3, 128: [[12.0, 8.0]] * 3})},
    position=PositionCurves([0, 64, 128], [(0, 64), (64, 128)], {"tiny": CURVE}, {"tiny": CURVE}, CURVE, CURVE),
    entropy=HeadEntropy([0, 64, 128], "nats", [[[1.0, 2.0]]], [1.0, 2.0]), entropy_by_length={64: 1.5, 128: 1.9},
    passkey=PasskeyResults("compact", {128: 0.5}, 0.5, {128: (0.1, 0.9)}, [PasskeyCell(128, 0.0, 0.5)],
                           [PasskeyOutcome(128, 0.0, "12345", True), PasskeyOutcome(128, 0.0, "54321", False)]),
    longctx={"multikey_retrieval": {128: 0.25}}, longctx_skipped={"passage_count/len64": "too short"},
    longbench={"longbench/qasper": 0.1}, harness={"harness/piqa/acc": 0.6})
SEARCH = ScaleSearchResult(
    train_len=64, best={128: 1.2}, study="s", model_fingerprint="abc", checkpoint="runs:/x/model", grid=(0.8, 2.0),
    best_on_grid_edge={128: False}, best_logppl={128: 3.1},
    per_position_best=[PositionBest(80.0, 1.25, 1.1), PositionBest(112.0, 1.75, 1.3)], fit=LogFit(0.4, 0.9),
    intervals=SelectionIntervals({128: (1.1, 1.3)}, (0.2, 0.6), (0.5, 0.99)),
    samples=SearchSamples([0, 1], [0, 64, 128], {128: [[[10.0, 8.0]] * 2] * 2}, [[[1.0, 2.0]] * 2] * 2),
    trials=[SearchTrial(1.0, {128: 3.2}, "r1", "nope-lightning run evaluate …"), SearchTrial(1.2, {128: 3.1})])
HEADSCALE = HeadScaleResult("runs:/x/model", "abc", 64, 256, "1/sqrt(head_size)", "lambda", "search", 1.2, "s1",
                            True, 1.0, 10, "recipe", 0.4, 3.3, "head_scale", [[1.1, 1.4]],
                            ConvergedEntropy("nats", [[1.0, 2.0]], "last 1/4 of 256"))
CELL = SyntheticCell("r", "copy_repeat", "nope", 0, "none", 4, 6, 1.0, 0.5, 1.0, 8, 8, 1.5, 0.5, 1000,
                     [BucketAccuracy("1-2", "id", 3, 1.0), BucketAccuracy("5-6", "ood", 3, 0.5)],
                     [Failure(6, "a b", "a b a b", "a b a")])
GRID = SyntheticGridResult("p", {"nope": 1.0}, {"copy_repeat": {"nope": 0.5}}, {"ood": "| task |", "id": "| task |"},
                           {"copy_repeat": TaskAttention({"ALiBi": {5: 0.1}}, {"ALiBi": {5: [0.1, 0.2]}},
                                                         {"NoPE": [1, 2]}, [0.0, 0.5, 1.0])}, [CELL])


def on_disk(result) -> dict:
    """What a file holds: the JSON text the stage writes, parsed back."""
    return json.loads(json.dumps(result.to_dict(), default=str))


@pytest.mark.parametrize("result", [EVALUATION, SEARCH, HEADSCALE, CELL, GRID], ids=lambda r: r.KIND)
def test_every_result_round_trips_through_its_file(result, tmp_path):
    path = tmp_path / "result.json"
    result.save(path)
    loaded = type(result).load(path)
    expected = result if not isinstance(result, SyntheticGridResult) else \
        SyntheticGridResult(**{**vars(result), "runs": [SyntheticCell(**{**vars(CELL), "errors": []})]})
    assert loaded == expected  # the grid keeps its cells without their failures
    assert on_disk(loaded) == on_disk(expected) and on_disk(loaded)["version"] == type(result).VERSION


def test_a_file_written_before_versions_is_read_as_version_one():
    legacy = on_disk(EVALUATION)
    del legacy["version"]
    assert EvaluationResult.from_dict(legacy) == EVALUATION
    committed = {**on_disk(SEARCH)}
    del committed["version"]
    assert ScaleSearchResult.from_dict(committed) == SEARCH
    # the layout the committed reports were made from: string length keys, lists for pairs, no version
    passkey = EvaluationResult.from_dict({"train_len": 64, "corpora": ["tiny"], "passkey": {
        "prompt": "compact", "by_length": {"128": 1.0}, "overall": 1.0, "by_length_interval": {"128": [0.2, 1.0]},
        "by_cell": [[128, 0.0, 1.0]], "samples": [[128, 0.0, "12345", True]]}}).passkey
    assert passkey.samples == [PasskeyOutcome(128, 0.0, "12345", True)] and passkey.by_length == {128: 1.0}
    assert passkey.at(128)[0].prompt == (128, 0.0, "12345") and passkey.at(256) == []


def test_a_newer_version_fails_in_one_line(tmp_path):
    path = tmp_path / "scale_search.json"
    path.write_text(json.dumps({**on_disk(SEARCH), "version": ScaleSearchResult.VERSION + 1}))
    with pytest.raises(ValueError, match=r"is a scale-search result of format version 2, newer than this") as err:
        ScaleSearchResult.load(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_bundle_keeps_every_result_at_its_place_and_reads_back(tmp_path):
    """A report's results bundle: each result through its type (gzipped JSON), placed by its run key, the
    experiment files, recipe rows and run-made files; written twice from the same results, the same bytes."""
    config = tmp_path / "small.yaml"
    config.write_text("name: small\n")
    figure = tmp_path / "headscale-fig5.png"
    figure.write_bytes(b"png")
    keys = [RunKey("nope", 1234, (("n_layer", "2"),), "evaluate", "eval_nope"),
            RunKey("nope lambda=1.5", 1234, (), "scale-search", "search"), RunKey("nope", 2345, (), "headscale", "hs"),
            RunKey("grid", 7, (), "synthetic-grid", "grid")]
    results = [Placed(k, f"run-{n}", r) for n, (k, r) in enumerate(zip(keys, [EVALUATION, SEARCH, HEADSCALE, GRID], strict=True))]
    bundle = Bundle([("small", "abc"), ("other", "def")], [config, None], results,
                    [Recipe("pretrain-nope", {"seed": "1234", "tokens_per_parameter": "None"})], [figure])
    folder = bundle.write(tmp_path / "results")
    first = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert sorted(map(str, first)) == ["evaluate/nope-s1234-n_layer2.json.gz", "files/headscale-fig5.png",
                                       "headscale/nope-s2345.json.gz", "index.json", "pipeline-abc.yaml",
                                       "scale-search/nope_lambda_1.5-s1234.json.gz",
                                       "synthetic-grid/grid-s7-taskcopy_repeat-penope.json.gz"]
    back = Bundle.read(folder)
    assert back.pipelines == bundle.pipelines and back.pretrains == bundle.pretrains
    assert [p.key for p in back.results] == keys and [p.name for p in back.results] == [p.name for p in results]
    assert [on_disk(p.result) for p in back.results] == [on_disk(p.result) for p in results]
    assert back.configs[0].read_text() == "name: small\n" and back.configs[1] is None
    assert back.files[0].read_bytes() == b"png"
    back.write(folder)  # in place, from its own files: the same bytes
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == first


def test_a_grid_result_is_named_by_the_task_it_holds_so_a_joining_slice_renames_nothing(tmp_path):
    """Seed slices of task files share method and seed (``grid``, 3): each is named by its (task, format), and a
    PE slice by its PEs too, so a slice that joins later leaves the others' names as they were; a matrix point
    that names the task already is not repeated, and a grid of two tasks, or two slices alike in all of these, are
    numbered."""
    def grid(*cells: tuple[str, str], pes: tuple[str, ...] = PAPER_PES) -> SyntheticGridResult:
        return SyntheticGridResult(**{**vars(GRID), "runs": [
            SyntheticCell(**{**vars(CELL), "task": task, "scratchpad": fmt, "pos_encoding": pe})
            for task, fmt in cells for pe in pes]})

    key, pointed = RunKey("grid", 3, (), "synthetic-grid", "grid"), RunKey("grid", 3, (("task", "copy"),), "synthetic-grid", "grid")
    held = [(key, grid(("reverse", "none"))), (key, grid(("parity", "full"))), (pointed, grid(("copy", "none"))),
            (key, grid(("copy", "none"), ("reverse", "none"))), (key, grid(("reverse", "none"), ("reverse", "none")))]

    def names(results) -> list[str]:
        folder = Bundle([("s", "a")], [None], [Placed(k, "grid", r) for k, r in results]).write(tmp_path / "b")
        return [e["file"].removeprefix("synthetic-grid/") for e in json.loads((folder / "index.json").read_text())["results"]]

    assert names(held) == ["grid-s3-taskreverse.json.gz", "grid-s3-taskparity-scratchpadfull.json.gz",
                           "grid-s3-taskcopy.json.gz", "grid-s3.json.gz", "grid-s3-taskreverse-2.json.gz"]
    assert names([(key, grid(("copy_2x", "none"))), *held[:2]])[1:] == names(held[:2])
    # PE slices of one (task, format, seed), in either join order: named by their PEs, in the order they ran
    slices = [(key, grid(("sort_symbols", "full"), pes=("rope", "sinusoidal"))),
              (key, grid(("sort_symbols", "full"), pes=("nope", "t5", "alibi")))]
    assert names(slices) == ["grid-s3-tasksort_symbols-scratchpadfull-perope_sinusoidal.json.gz",
                             "grid-s3-tasksort_symbols-scratchpadfull-penope_t5_alibi.json.gz"]
    assert names(slices[::-1]) == names(slices)[::-1]


def test_a_missing_newer_or_damaged_bundle_fails_in_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no index.json: point also=\[\{results: \.\.\.\}\] at"):
        Bundle.read(tmp_path / "nowhere")
    folder = Bundle([("small", "abc")], [None], [Placed(RunKey("nope", 1, (), "evaluate"), "r", EVALUATION)]).write(
        tmp_path / "results")
    index = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps({**index, "version": 2}))
    with pytest.raises(ValueError, match="results bundle of format version 2, newer than this nope-lightning"):
        Bundle.read(folder)
    (folder / "index.json").write_text(json.dumps(index))
    (folder / "evaluate/nope-s1.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"damaged results bundle \(BadGzipFile.*git checkout --") as err:
        Bundle.read(folder)
    assert "\n" not in str(err.value)


# --- the results home is the only reader of a result file ------------------------------------------------

#: The files the stages write their results to.
RESULT_FILES = ("results.json", "scale_search.json", "headscale.json")
HOME = "results"


class _Scopes(ast.NodeVisitor):
    """Per innermost function (or the module body): where it parses JSON and the result files it names."""

    def __init__(self) -> None:
        self.stack = ["<module>"]
        self.parses: dict[str, int] = {}
        self.names: dict[str, str] = {}

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(f"{node.name}@{node.lineno}")
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("load", "loads") and \
                isinstance(func.value, ast.Name) and func.value.id == "json":
            self.parses.setdefault(self.stack[-1], node.lineno)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and (name := next((f for f in RESULT_FILES if f in node.value), None)):
            self.names.setdefault(self.stack[-1], name)


def result_file_reads(path: Path) -> list[str]:
    """``line: function reads <file>`` for every function (or module body) of ``path`` that parses JSON
    (``json.load`` / ``json.loads``) and names a result file: it reads a result file's keys itself."""
    scopes = _Scopes()
    scopes.visit(ast.parse(path.read_text(), str(path)))
    return [f"{line}: {scope.split('@')[0]} reads {scopes.names[scope]}" for scope, line in scopes.parses.items()
            if scope in scopes.names]


def test_no_module_but_the_results_home_reads_a_result_file():
    package = REPO / "nope_lightning"
    offenders = [f"{path.relative_to(REPO)}:{where}" for path in sorted(package.rglob("*.py"))
                 if path.relative_to(package).parts[0] != HOME for where in result_file_reads(path)]
    assert not offenders, "read result files through nope_lightning.results:\n" + "\n".join(offenders)


def test_the_check_catches_a_result_file_read_by_hand(tmp_path):
    by_hand = tmp_path / "by_hand.py"
    by_hand.write_text("import json\n\n\ndef read(store, run):\n    path = store.download(run, 'scale_search.json')\n"
                       "    return json.loads(path.read_text())['best']\n\n\n"
                       "def fine(path):\n    return json.loads(path.read_text())\n")
    assert result_file_reads(by_hand) == ["6: read reads scale_search.json"]
