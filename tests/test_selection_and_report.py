"""Selection on validation data, reporting on test data: the lambda grid, the search's split, and the report's
position ranges, tables with intervals and seed counts, and ablation notes (computed from hand-made results)."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pytest

from nope_lightning.analysis.lengthgen.claims import evaluate_claim
from nope_lightning.analysis.lengthgen.report_sections import claims_table, search_section
from nope_lightning.analysis.lengthgen.tables import ablation_table, paired_table, passkey_table, ppl_tables
from nope_lightning.analysis.markdown import MISSING, html_page
from nope_lightning.analysis.report_frame import RECIPE_KEYS, recipe_section
from nope_lightning.analysis.sources import Methods
from nope_lightning.analysis.verdicts import Outcome
from nope_lightning.config import PipelineConfig, PipelineStep, ScaleSearchConfig, load_config
from nope_lightning.config.paper import CLAIMS_BY_ID, TABLE4
from nope_lightning.eval.summary import octaves
from nope_lightning.numerics.stats import Interval, prediction_interval, t_interval, wilson
from nope_lightning.results import EvaluationResult, ScaleSearchResult
from nope_lightning.results.bundle import Recipe
from nope_lightning.stages.scale_search import trial_config
from tests.conftest import REPO


def test_the_default_grid_reaches_below_one_and_must_contain_it():
    cfg = ScaleSearchConfig(checkpoint="x", target_lengths=[256])
    assert cfg.lambdas[0] == 0.8 and 1.0 in cfg.lambdas and cfg.lambdas[-1] == 2.5
    with pytest.raises(ValueError, match="does not contain 1.0"):
        load_config(ScaleSearchConfig, None, ["checkpoint=x", "target_lengths=[256]", "grid=[1.2,1.5]"])
    with pytest.raises(ValueError, match="does not contain 1.0"):
        load_config(ScaleSearchConfig, None, ["checkpoint=x", "target_lengths=[256]", "grid_min=0.85",
                                              "grid_step=0.1"])


def test_search_trials_score_the_validation_split():
    cfg = ScaleSearchConfig(checkpoint="x", target_lengths=[256, 512])
    trial = trial_config(cfg, 1.3, "parent", 0)
    assert trial.split == "val" and trial.extension.temperature.uniform == 1.3 and trial.eval_lengths == [256, 512]


def test_octaves_are_the_ranges_past_L():
    assert octaves(128, 1024) == [(0, 128), (128, 256), (256, 512), (512, 1024)]
    assert octaves(100, 250) == [(0, 100), (100, 200), (200, 250)]  # the last one cut at the longest window


def run_result(nll: float, lengths=(100, 200), passkey: list[bool] | None = None,
               table: list | None = None, tuning_len: int | None = None) -> EvaluationResult:
    """An evaluate ``results.json`` as the tables read it (one corpus, per-length NLL with its interval)."""
    out = {"train_len": 100, "split": "test", "stride": 12, "lengths": list(lengths), "corpora": ["kjv"],
           "tuning_len": tuning_len,
           "ppl": {"kjv": {str(n): {"nll": nll + n / 1000, "nll_low": nll + n / 1000 - 0.05,
                                    "nll_high": nll + n / 1000 + 0.05, "ppl": math.exp(nll + n / 1000),
                                    "tokens": 1000}
                           for n in lengths}}}
    if passkey is not None:
        out["passkey"] = {"prompt": "compact", "samples": [[100, 0.0, str(i), ok] for i, ok in enumerate(passkey)],
                          "by_length": {"100": sum(passkey) / len(passkey)}}
    if table is not None:
        out["temperature_table"] = table
    return EvaluationResult.from_dict(out)


def test_tables_show_intervals_seed_counts_and_a_dash_for_what_did_not_run():
    one_seed = {"nope": {None: run_result(3.0, passkey=[True, True, False, False])},
                "rope": {None: run_result(2.9, lengths=(100,))}}
    text = ppl_tables(one_seed, {})
    assert "1 seed: [95 % interval of the run" in text
    assert f"| nope | {math.exp(3.1):.1f} [{math.exp(3.05):.1f}, {math.exp(3.15):.1f}] |" in text
    assert text.split("| rope |")[1].split("|")[1].strip() == "—"  # rope was not run at 2x
    passkey = passkey_table(one_seed)
    low, high = wilson(2, 4).low, wilson(2, 4).high
    assert f"| nope | 0.50 [{low:.2f}, {high:.2f}] |" in passkey
    three = {"nope": {s: run_result(3.0 + 0.01 * s) for s in (1, 2, 3)}}
    interval = t_interval([3.0 + 0.01 * s + 0.1 for s in (1, 2, 3)])
    assert (f"{math.exp(interval.estimate):.1f} [{math.exp(interval.low):.1f}, {math.exp(interval.high):.1f}]"
            in ppl_tables(three, {}))
    assert "3 seeds: mean over seeds, [95 % t interval across seeds]" in ppl_tables(three, {})


def passkey_result(outcomes: dict[int, list[bool]], key_tokens: dict[int, list[int]] | None = None) -> EvaluationResult:
    """An evaluate ``results.json`` with passkey prompts only (L = 100): per length, each prompt's outcome and,
    when given, its key's token count (absent: a file written before the counts were recorded)."""
    samples = [[n, 0.0, str(10000 + i), ok] for n, oks in outcomes.items() for i, ok in enumerate(oks)]
    passkey = {"prompt": "compact", "samples": samples,
               "by_length": {str(n): sum(oks) / len(oks) for n, oks in outcomes.items()}}
    if key_tokens is not None:
        passkey["key_tokens"] = [k for n in outcomes for k in key_tokens[n]]
    return EvaluationResult.from_dict({"train_len": 100, "corpora": ["kjv"], "lengths": [100, 200],
                                       "passkey": passkey})


def test_passkey_headers_say_where_the_answer_falls_relative_to_L():
    # L = 100; the k key tokens are generated after a prompt of n tokens, at positions n + 1 .. n + k (1-based).
    outcomes = {94: [True, True], 97: [True, False], 100: [True, False], 200: [False, False]}
    counts = {94: [6, 6], 97: [6, 6], 100: [6, 6], 200: [5, 6]}
    runs = {"nope": {None: passkey_result(outcomes, counts)}, "rope": {None: passkey_result(outcomes, counts)}}
    header = next(line for line in passkey_table(runs).splitlines() if line.startswith("| method"))
    assert header == ("| method | 94 (answer at 95-100: inside L) | 97 (answer at 98-103: crosses L) "
                      "| 100 (answer at 101-106: past L) | 200 (answer at 201 to 205-206: past L) | all lengths |")
    legacy = {"nope": {None: passkey_result(outcomes)}}  # no counts recorded: only the first position is known
    header = next(line for line in passkey_table(legacy).splitlines() if line.startswith("| method"))
    assert header == ("| method | 94 (answer after token 94) | 97 (answer after token 97) "
                      "| 100 (answer after token 100: past L) | 200 (answer after token 200: past L) | all lengths |")
    assert legacy["nope"][None].passkey.samples[0].key_tokens is None
    # The paired table heads its passkey columns the same way, at the whole multiples of L the claims read.
    paired = paired_table(runs, 100, "nope")
    header = next(line for line in paired.splitlines() if line.startswith("| method"))
    assert header == ("| method | Δ log-PPL 1x | Δ log-PPL 2x | Δ passkey 1x = 100 (answer at 101-106: past L) "
                      "| Δ passkey 2x = 200 (answer at 201 to 205-206: past L) |")
    assert "| rope | — | — | +0.000 [+0.000, +0.000] (0/1) | +0.000 [+0.000, +0.000] (0/1) |" in paired


def test_the_ablation_table_reads_ppl_at_the_tuning_length():
    # Tuned at 300 tokens, evaluated at 100, 200, 400: PPL at 200, the largest evaluated length <= 300 (paper 001's
    # Table 4: PPL at 16K of tables tuned at 18K). run_result's NLL at n tokens is nll + n / 1000 +- 0.05.
    runs = {"headscale 4x": {None: run_result(3.0, lengths=(100, 200, 400), tuning_len=300)},
            "headscale 4x w/o init": {None: run_result(3.5, lengths=(100, 200, 400), tuning_len=400)},
            "headscale 4x w/o constraint": {None: run_result(3.5, lengths=(100, 200, 400))}}
    rows = {"headscale 4x": "headscale", "headscale 4x w/o init": "headscale w/o init",
            "headscale 4x w/o constraint": "headscale w/o constraint"}
    text = ablation_table(runs, [], rows)
    assert "| method | PPL @ tuning length (tokens) |" in text
    cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in text.splitlines()
             if line.startswith("| headscale")}
    assert cells["headscale 4x"] == (f"{math.exp(3.2):.1f} [{math.exp(3.15):.1f}, {math.exp(3.25):.1f}] @ 200 "
                                     f"(tuned at 300)")
    assert cells["headscale 4x w/o init"] == f"{math.exp(3.9):.1f} [{math.exp(3.85):.1f}, {math.exp(3.95):.1f}] @ 400"
    assert cells["headscale 4x w/o constraint"] == MISSING  # no tuning length recorded: no PPL, and a note says why
    assert "Note: no PPL for headscale 4x w/o constraint: the results record no single tuning length" in text
    three = {"headscale 4x": {s: run_result(3.0 + 0.01 * s, lengths=(100, 200, 400), tuning_len=300)
                              for s in (1, 2, 3)}}
    interval = t_interval([3.0 + 0.01 * s + 0.2 for s in (1, 2, 3)])  # mean log-PPL at 200 over seeds
    assert (f"| headscale 4x | {math.exp(interval.estimate):.1f} [{math.exp(interval.low):.1f}, "
            f"{math.exp(interval.high):.1f}] @ 200 (tuned at 300) |") in ablation_table(three, [], rows)


def test_the_tuning_length_headscale_wrote_into_its_table_reads_back(tmp_path):
    import torch

    from nope_lightning.config import AttentionTemperature
    from nope_lightning.model.temperature import LOG_SLOPE, save_table, tuning_len

    save_table(tmp_path / "lambda.safetensors", torch.ones(2, 2), {"target_len": 512})  # as HeadScale saves it
    assert tuning_len(AttentionTemperature(table=str(tmp_path / "lambda.safetensors"))) == 512
    assert tuning_len(AttentionTemperature(table=str(tmp_path / "lambda.json"))) == 512  # the readable twin
    save_table(tmp_path / "log_scale.safetensors", torch.zeros(2, 2), {"target_len": 256}, LOG_SLOPE)
    assert tuning_len(AttentionTemperature(log_slope_table=str(tmp_path / "log_scale.safetensors"))) == 256
    save_table(tmp_path / "by_hand.safetensors", torch.ones(2, 2))  # a table no tuning produced
    assert tuning_len(AttentionTemperature(table=str(tmp_path / "by_hand.safetensors"))) is None
    assert tuning_len(AttentionTemperature(1.5)) is None
    recorded = run_result(3.0, tuning_len=512)
    assert EvaluationResult.from_dict(recorded.to_dict()).tuning_len == 512
    assert "tuning_len" not in run_result(3.0).to_dict()  # unknown: absent from the file, as in older files


def test_a_degenerate_ablation_is_noted_and_an_edge_optimum_flagged():
    table = [[1.2, 1.3]]
    runs = {"headscale 4x": {None: run_result(3.0, lengths=(400,), passkey=[True] * 10, table=table)},
            "headscale 4x w/o init": {None: run_result(3.0, lengths=(400,), passkey=[True] * 10, table=table)}}
    outcome = evaluate_claim(CLAIMS_BY_ID["no_init_loses_retrieval"], runs, 200)
    assert outcome.verdict == "no effect of init here"
    text = ablation_table(runs, [outcome], {"headscale 4x": "headscale", "headscale 4x w/o init": "headscale w/o init"})
    assert "Note: headscale 4x w/o init's temperature table is within 0.01 of headscale 4x's" in text
    search = ScaleSearchResult.from_dict(
        {"train_len": 128, "best": {"256": 1.0, "512": 2.0}, "best_on_grid_edge": {"256": False, "512": True},
         "grid": [0.8, 2.0], "split": "val", "fit": {"a": 0.1, "r2": 0.5},
         "intervals": {"best": {"256": [1.0, 1.2], "512": [1.8, 2.0]}, "fit": {"a": [0.05, 0.2], "r2": [0.1, 0.7]}}})
    text = search_section("search_nope", {1234: search})
    assert "chosen on the val split" in text and "512: 2 [1.8, 2] (grid edge)" in text
    assert "256: 1 [1, 1.2]," in text and "0.100 [0.050, 0.200]" in text


def test_study_names_are_readable_and_stable():
    from nope_lightning.runtime.search import study_name

    settings = {"model": "abc", "targets": [256, 512], "grid": [0.8, 1.0]}
    name = study_name("pretrain-nope-kjv-L128", "scale-search L128->256,512 grid lambda 0.8-1", settings)
    assert re.fullmatch(r"pretrain-nope-kjv-L128 scale-search L128->256,512 grid lambda 0\.8-1 \([0-9a-f]{6}\)", name)
    assert name == study_name("pretrain-nope-kjv-L128", "scale-search L128->256,512 grid lambda 0.8-1",
                              dict(reversed(settings.items())))  # a killed search finds its study again
    assert name != study_name("pretrain-nope-kjv-L128", "scale-search L128->256,512 grid lambda 0.8-1",
                              {**settings, "model": "abd"})  # another model: another study


def test_the_html_report_embeds_its_images_and_renders_tables(tmp_path):
    import base64

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    fig.savefig(tmp_path / "curve.png")
    page = html_page("# R\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![curve.png](curve.png)\n", tmp_path, "R")
    assert "<table>" in page and "<td>2</td>" in page
    encoded = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(encoded) == (tmp_path / "curve.png").read_bytes()  # embedded, not linked
    assert 'src="curve.png"' not in page


def test_the_recipe_table_shows_an_unset_setting_as_not_set():
    # MLflow stores params as strings: tokens_per_parameter=None (the budget given by max_steps) arrives as "None".
    params = {"model.pos_encoding": "nope", "trainer.max_steps": "2750", "tokens_per_parameter": "None"}
    (row,) = [line for line in recipe_section([Recipe("pretrain-nope", params)]).splitlines() if line.startswith("| pretrain-nope")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1 + RECIPE_KEYS.index("tokens_per_parameter")] == MISSING
    assert cells[1 + RECIPE_KEYS.index("trainer.max_steps")] == "2750"
    assert cells[1 + RECIPE_KEYS.index("seed")] == MISSING and "None" not in row


def test_a_method_sits_beside_the_paper_row_its_experiment_file_names_and_no_other():
    # small_temperature's HeadScale-log is no Table 4 method: before rows were data, its label's substring
    # "headscale" put it beside the paper's HeadScale row (30.4 / 81 % / 17.0).
    cfg = load_config(PipelineConfig, REPO / "experiments/small_temperature/small_temperature.yaml")
    runs = {"nope": {None: run_result(3.0, lengths=(400,))}, "headscale-log 4x": {None: run_result(3.1, lengths=(400,))}}
    methods = Methods.of(cfg)
    assert "headscale-log 4x" not in methods.paper_rows("table4")
    assert ablation_table(runs, [], methods.paper_rows("table4")) == ""
    beside = ablation_table(runs, [], {"headscale-log 4x": "headscale"})  # only where a file says so
    paper_cell = f"{TABLE4['headscale']['pg19']} / {TABLE4['headscale']['passkey']}% / {TABLE4['headscale']['longbench']}"
    assert paper_cell in beside
    small = Methods.of(load_config(PipelineConfig, REPO / "experiments/small/small.yaml"))
    assert small.paper_rows("table4") == {"headscale 4x": "headscale", "headscale 4x w/o init": "headscale w/o init",
                                          "headscale 4x w/o constraint": "headscale w/o constraint"}
    assert small.reference == "nope" and "rope" not in small.nope_family and "headscale 4x" in small.nope_family


@pytest.mark.parametrize(("change", "message"), [
    ({"paper": {"table4": "headscale log"}}, "paper 001's table4 has no row 'headscale log'"),
    ({"paper": {"table9": "nope"}}, "paper 001 has no table 'table9'"),
    ({"family": "nope-ish"}, "family='nope-ish': use one of nope"),
])
def test_an_unknown_paper_row_or_family_fails_at_load_with_one_line(change, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        PipelineConfig(name="p", steps=[PipelineStep(id="eval_nope", stage="evaluate", label="nope", **change)])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="reference: 'rope' is no step's label"):
        PipelineConfig(name="p", reference="rope", steps=[PipelineStep(id="eval_nope", stage="evaluate", label="nope")])


class _Cells(HTMLParser):
    """The cell count of every row of every table in an HTML page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[int]] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append(0)
        elif tag in ("td", "th"):
            self.tables[-1][-1] += 1


def test_a_cell_holding_a_pipe_renders_in_its_own_column_of_the_html_report(tmp_path):
    within = CLAIMS_BY_ID["nope_matches_rope_in_distribution"]
    assert "|" in within.rule  # |effect| <= ...
    per_seed = (0.2, 0.21)
    outcomes = [Outcome(within, "not reproduced", Interval(0.2, 0.19, 0.21, per_seed=per_seed), (1, 2),
                        across=t_interval(per_seed), prediction=prediction_interval(per_seed)),
                Outcome(CLAIMS_BY_ID["nope_degrades_later"], "not measured", reason="no run of 'rope'")]
    page = html_page("# R\n\n" + claims_table(outcomes), tmp_path, "R")
    parser = _Cells()
    parser.feed(page)
    (rows,) = parser.tables
    assert len(rows) == 3 and set(rows) == {12}, rows  # header + 2 rows, each with the header's 12 cells
    assert "<td>|effect| &lt;= 0.0953 nats</td>" in page


def test_the_key_nll_table_averages_each_seed_s_prompts_then_the_seeds():
    from scipy import stats

    from nope_lightning.analysis.lengthgen.tables import key_nll_table

    def with_nll(passkey: list[bool], nll: list[float] | None) -> EvaluationResult:
        data = run_result(3.0, passkey=passkey).to_dict()
        if nll is not None:
            data["passkey"]["key_nll"] = nll
            data["passkey"]["key_tokens"] = [3] * len(nll)
        return EvaluationResult.from_dict(data)

    runs = {"nope": {1: with_nll([True, False], [0.5, 1.5]), 2: with_nll([True, True], [0.25, 0.75])},
            "old": {1: with_nll([True, False], None)}}  # results written before the NLL was: no row
    text = key_nll_table(runs)
    mean = stats.t.interval(0.95, 1, loc=0.75, scale=0.25)  # seeds' means 1.0 and 0.5: mean 0.75, sem 0.25
    assert f"| nope | 0.75 [{max(mean[0], 0.0):.2f}, {mean[1]:.2f}] |" in text  # an NLL is >= 0: clipped
    assert "old" not in text and "100 (answer at 101-103: past L)" in text and "2 seeds" in text
    one = key_nll_table({"nope": {None: with_nll([True, False, True], [0.5, 1.5, 1.0])}})
    low, high = stats.t.interval(0.95, 2, loc=1.0, scale=stats.sem([0.5, 1.5, 1.0]))
    assert f"| nope | 1.00 [{max(low, 0.0):.2f}, {high:.2f}] |" in one
    assert key_nll_table({"old": runs["old"]}) == ""


# --- the report's frame: its title, figure captions, footnotes and provenance -------------------------------

BUNDLED = ["headscale_retrieval", "hybrids", "regime_study", "synthetic"]  # the studies that commit a bundle
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


def test_a_study_is_named_by_the_words_its_pipelines_share_else_by_the_first():
    from nope_lightning.analysis.report_frame import study_name

    assert study_name([("regime_study_s8901", "a"), ("regime_study", "b")]) == "regime_study"
    assert study_name([("synthetic_copy", "a"), ("synthetic_scratchpad_lego", "b")]) == "synthetic"
    assert study_name([("hybrids", "a"), ("hybrids", "b")]) == "hybrids"
    assert study_name([("tiny", "a"), ("seed7", "b")]) == "tiny"


def test_a_note_marked_in_many_rows_is_printed_once():
    from nope_lightning.analysis.markdown import Footnotes

    notes = Footnotes()
    assert [notes.mark("long note"), notes.mark("other"), notes.mark("long note")] == ["[1]", "[2]", "[1]"]
    assert notes.render() == "* [1] long note\n* [2] other"
    assert Footnotes().render() == ""


def test_every_figure_the_report_draws_has_a_title_of_its_own_and_a_caption_naming_its_seeds():
    from nope_lightning.stages.report import point_sections
    from tests.test_results import EVALUATION, HEADSCALE, SEARCH

    evals = {m: {s: EVALUATION for s in (1234, 2345)} for m in ("nope", "headscale 4x", "rope")}
    evals["nope lambda=1.5"] = {1234: EVALUATION}
    searches = {"search_nope": {1234: SEARCH, 2345: SEARCH}}
    headscales = {"headscale_4x": {2345: HEADSCALE, 1234: HEADSCALE},
                  "headscale_4x_noinit": {1234: HEADSCALE}}
    methods = Methods(reference="nope", nope_family=frozenset({"nope", "nope lambda=1.5", "headscale 4x"}))
    _, figures = point_sections(evals, searches, headscales, [], 100, methods)
    assert sorted(figures) == ["entropy_heads_by_position.png", "entropy_heads_past_L.png",
                               "fig5_tuned_by_layer.png",  # the per-layer Fig 5: only the tuned view measured
                               "headscale_4x-entropy_vs_lambda.png",
                               "headscale_4x_noinit-entropy_vs_lambda.png", "lambda_fit_s1234.png",
                               "lambda_fit_s2345.png", "passkey_heatmaps.png",
                               "position_curves_baselines.png", "position_curves_nope.png"]
    titles = {name: plot.figure.axes[0].get_title() for name, plot in figures.items()}
    assert len(set(titles.values())) == len(titles), titles
    assert titles["headscale_4x-entropy_vs_lambda.png"] == "headscale_4x, seed 2345, at 256"  # read first
    assert titles["lambda_fit_s1234.png"] == "search_nope, seed 1234: uniform temperature search"
    captions = {name: plot.caption for name, plot in figures.items()}
    assert all(re.search(r"\bseeds? \d", caption) for caption in captions.values()), captions
    nope = captions["position_curves_nope.png"]
    assert "mean over seeds 1234, 2345 (`nope lambda=1.5`: seed 1234 only)" in nope
    assert "of `nope`, `rope`, mean over seeds 1234, 2345;" in captions["position_curves_baselines.png"]
    assert "of `nope` per head (Fig 10)" in captions["entropy_heads_by_position.png"]  # the reference's


@pytest.mark.parametrize("study", BUNDLED)
def test_a_committed_report_names_its_study_and_keeps_run_ids_for_its_provenance(study):
    import json

    folder = REPO / "experiments" / study / "results"
    text = (folder / "report.md").read_text()
    assert text.startswith(f"# Report: {study}\n")
    body, provenance = text.split("\n## Provenance\n")
    assert not RUN_ID.search(body)
    pipelines = json.loads((folder / "results/index.json").read_text())["pipelines"]
    assert RUN_ID.findall(provenance) == [run for _, run in pipelines]  # each once, in the order read
    assert f"From the results bundle experiments/{study}/results/results:" in provenance
    if (folder / "report.html").is_file():
        assert f"<title>Report: {study}</title>" in (folder / "report.html").read_text()


@pytest.mark.parametrize("study", BUNDLED)
def test_every_figure_of_a_committed_report_has_a_caption_naming_its_seeds_and_notes_appear_once(study):
    folder = REPO / "experiments" / study / "results"
    lines = (folder / "report.md").read_text().splitlines()
    images = [n for n, line in enumerate(lines) if line.startswith("![")]
    captions = [lines[n + 2] for n in images]
    assert images and all(re.fullmatch(r"\*Figure \d+\. .*\bseeds? \d.*\*", c) for c in captions), captions
    assert len(set(captions)) == len(captions)
    shown = {re.search(r"\]\((.+)\)$", lines[n]).group(1) for n in images}
    assert shown == {p.name for p in folder.glob("*.png")}
    notes = [line for line in lines if re.match(r"\* \[\d+\] ", line)]
    assert len({note.split("] ", 1)[1] for note in notes}) == len(notes)
