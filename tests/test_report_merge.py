"""Reports over several sources of one study: a result two sources both hold (a run and the bundle written from
it) counted once and said so, a step measured twice stopping the report; each claim's seeds dated by the rows it reads; Table 2's second
corpus in a table of its own; and HeadScale's tuned entropy at the last position, against a direct computation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from nope_lightning.analysis.lengthgen.fig5 import PERMUTATION_CLAIM, fig5_figures, fig5_section, views
from nope_lightning.analysis.lengthgen.plots import plt
from nope_lightning.analysis.lengthgen.tables import paired_table, ppl_tables
from nope_lightning.analysis.rule_changes import exploratory_note, read_days
from nope_lightning.analysis.sources import row_days
from nope_lightning.analysis.verdicts import Outcome
from nope_lightning.config.claim_rules import RuleChange
from nope_lightning.config.core import to_yaml
from nope_lightning.config.paper import CLAIMS_BY_ID, TABLE2_PG19, TABLE2_PROOFPILE, fmt
from nope_lightning.config.parts import ModelConfig
from nope_lightning.config.pipeline import PipelineConfig, PipelineStep, ReportConfig, ReportSource
from nope_lightning.eval.entropy import converged_entropy
from nope_lightning.model.gpt import GPT
from nope_lightning.model.probes import attention_probs
from nope_lightning.results.bundle import Bundle, Placed
from nope_lightning.results.headscale import HeadScaleResult
from nope_lightning.results.index import ResultIndex
from nope_lightning.results.runkey import RunKey
from nope_lightning.stages import report
from tests.test_claims import SEEDS, headscale, untuned_run
from tests.test_regime_rope_report import evaluation, search

PRETRAIN = PipelineStep(id="pretrain_nope", stage="pretrain", overrides=["model.n_layer=2"])
SEARCH = PipelineStep(id="search_nope", stage="scale-search", model="pretrain_nope", overrides=["grid_step=0.1"])
EVAL = PipelineStep(id="eval_nope", stage="evaluate", label="nope", family="nope", paper={"table2": "nope"},
                    model="pretrain_nope")


def write_bundle(folder, name: str, run_id: str, cfg: PipelineConfig, placed: list[Placed], day: str,
                 machine: str = ""):
    path = folder.parent / f"{name}.yaml"
    folder.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg))
    return Bundle([(name, run_id)], [path], placed, dates={run_id: day},
                  machines={run_id: machine} if machine else {}).write(folder)


def study(root, extra_search: PipelineStep, again: float = 1.2) -> tuple:
    """A committed bundle (NoPE evaluated and searched, seeds 1 and 2) and a later file that runs ``extra_search``
    as seed 1's search again (its best lambda ``again``) beside a new row (``nope lambda=1.5``)."""
    committed = write_bundle(
        root / "committed" / "results", "toy", "a" * 32,
        PipelineConfig(name="toy", seeds=[1, 2], reference="nope", steps=[PRETRAIN, SEARCH, EVAL]),
        [*(Placed(RunKey("nope", s, (), "evaluate", "eval_nope"), f"nope-{s}", evaluation("nope", s)) for s in (1, 2)),
         *(Placed(RunKey("search_nope", s, (), "scale-search", "search_nope"), f"sn-{s}", search(s, 1.2))
           for s in (1, 2))], "2026-11-26")
    new = PipelineStep(id="eval_nope_15", stage="evaluate", label="nope lambda=1.5", family="nope",
                       model="pretrain_nope", overrides=["extension.temperature.uniform=1.5"])
    extra = write_bundle(
        root / "extra" / "results", "toy_extra_s1", "b" * 32,
        PipelineConfig(name="toy_extra_s1", seeds=[1], steps=[PRETRAIN, extra_search, new]),
        [Placed(RunKey("search_nope", 1, (), "scale-search", "search_nope"), "sn-1-again", search(1, again)),
         Placed(RunKey("nope lambda=1.5", 1, (), "evaluate", "eval_nope_15"), "n15-1", evaluation("n15", 1))],
        "2026-11-28")
    return committed, extra


def test_a_result_held_twice_is_counted_once_and_named_in_the_provenance(tmp_path):
    committed, extra = study(tmp_path, SEARCH)
    out = tmp_path / "report"
    report.run(ReportConfig(out_dir=str(out), bootstrap=100,
                            also=[ReportSource(results=str(committed)), ReportSource(results=str(extra))]))
    text = (out / "report.md").read_text()
    provenance = text[text.index("## Provenance"):]
    assert (f"1 row read twice, counted once (the same result in two sources): "
            f"scale-search `search_nope` seed 1 (results bundle {committed} kept over results bundle {extra}).") \
        in provenance
    kept = Bundle.read(out / "results")
    searches = [p for p in kept.results if p.key.stage == "scale-search" and p.key.seed == 1]
    assert len(searches) == 1 and searches[0].name == "sn-1" and searches[0].result.best[256] == 1.2  # the first
    assert {p.key.method for p in kept.results} == {"nope", "search_nope", "nope lambda=1.5"}
    # The regenerated bundle holds each row once: it reads alone, and counts nothing again.
    again = tmp_path / "again"
    report.run(ReportConfig(out_dir=str(again), bootstrap=100, also=[ReportSource(results=str(out / "results"))]))
    assert "read twice" not in (again / "report.md").read_text()


def test_the_provenance_names_the_machines_that_ran_each_pipeline_where_recorded(tmp_path):
    """A run tagged with its machines (one continued elsewhere names both, joined by " | ") gets them in a
    provenance column, a run made before the tag reads "not recorded"; the report's bundle keeps them, and a
    report of untagged runs alone has no such column (its tables as before)."""
    committed, _ = study(tmp_path, SEARCH)
    new = PipelineStep(id="eval_nope_15", stage="evaluate", label="nope lambda=1.5", family="nope",
                       model="pretrain_nope", overrides=["extension.temperature.uniform=1.5"])
    two = "CPU A x2; torch 2.14.1; 2 threads; no GPU | CPU B x16; torch 2.14.1; 16 threads; NVIDIA H200 x1"
    tagged = write_bundle(tmp_path / "tagged" / "results", "toy_tagged", "c" * 32,
                          PipelineConfig(name="toy_tagged", seeds=[3], steps=[PRETRAIN, new]),
                          [Placed(RunKey("nope lambda=1.5", 3, (), "evaluate", "eval_nope_15"), "n15-3",
                                  evaluation("n15", 3))], "2026-12-01", machine=two)
    out = tmp_path / "report"
    report.run(ReportConfig(out_dir=str(out), bootstrap=100,
                            also=[ReportSource(results=str(committed)), ReportSource(results=str(tagged))]))
    provenance = (out / "report.md").read_text().split("## Provenance")[1]
    assert provenance.count("| pipeline | run id | ran (UTC day) | machine |") == 2
    assert f"| `toy` | {'a' * 32} | 2026-11-26 | not recorded |" in provenance
    assert f"| `toy_tagged` | {'c' * 32} | 2026-12-01 | {two.replace('|', chr(92) + '|')} |" in provenance
    assert Bundle.read(out / "results").machines == {"c" * 32: two}
    alone = tmp_path / "alone"
    report.run(ReportConfig(out_dir=str(alone), bootstrap=100, also=[ReportSource(results=str(committed))]))
    assert "| pipeline | run id | ran (UTC day) |\n" in (alone / "report.md").read_text()
    assert "machines" not in (alone / "results" / "index.json").read_text()


def test_a_step_measured_again_with_other_results_still_stops_the_report(tmp_path):
    committed, extra = study(tmp_path, SEARCH, again=1.4)
    with pytest.raises(ValueError, match="both hold scale-search 'search_nope' seed 1 with different results"):
        report.run(ReportConfig(out_dir=str(tmp_path / "r"), bootstrap=100,
                                also=[ReportSource(results=str(committed)), ReportSource(results=str(extra))]))


def test_a_source_read_for_named_steps_only_joins_a_study_that_re_trained_a_seed(tmp_path):
    """The later file re-trained seed 1 (its search found 1.4, not the committed 1.2): read for its new step only,
    it joins the committed bundle, whose search stays; a step it never ran is refused by name."""
    committed, extra = study(tmp_path, SEARCH, again=1.4)
    out = tmp_path / "report"
    report.run(ReportConfig(out_dir=str(out), bootstrap=100, also=[
        ReportSource(results=str(committed)), ReportSource(results=str(extra), steps=["eval_nope_15"])]))
    kept = Bundle.read(out / "results")
    assert sorted((p.key.method, p.key.seed) for p in kept.results) == [
        ("nope", 1), ("nope", 2), ("nope lambda=1.5", 1), ("search_nope", 1), ("search_nope", 2)]
    assert [p.result.best[256] for p in kept.results if p.key.stage == "scale-search"] == [1.2, 1.2]
    text = (out / "report.md").read_text()
    assert "read twice" not in text
    assert f"From the results bundle {extra}, only the steps `eval_nope_15`." in text
    with pytest.raises(ValueError, match=r"holds no result of step\(s\) eval_nope_18: name the step ids"):
        report.run(ReportConfig(out_dir=str(tmp_path / "r"), bootstrap=100, also=[
            ReportSource(results=str(committed)), ReportSource(results=str(extra), steps=["eval_nope_18"])]))


def test_claims_from_judges_the_claims_a_study_file_lists_now_not_those_its_runs_logged(tmp_path):
    """The committed runs logged a file without claims; the study file lists one since: ``claims_from`` judges it
    (on the committed seeds: no verdict below 5), says so in the provenance, and refuses a path that is not
    there or a list given beside it."""
    committed, extra = study(tmp_path, SEARCH)
    declaring = tmp_path / "toy.yaml"
    declaring.write_text(to_yaml(PipelineConfig(name="toy", seeds=[1, 2], claims=["nope_breaks_past_L"],
                                                steps=[PRETRAIN, SEARCH, EVAL])))
    sources = [ReportSource(results=str(committed)), ReportSource(results=str(extra))]
    plain, judged = tmp_path / "plain", tmp_path / "judged"
    report.run(ReportConfig(out_dir=str(plain), bootstrap=100, also=sources))
    report.run(ReportConfig(out_dir=str(judged), bootstrap=100, also=sources, claims_from=str(declaring)))
    claim = CLAIMS_BY_ID["nope_breaks_past_L"].text
    assert claim not in (plain / "report.md").read_text()
    text = (judged / "report.md").read_text()
    assert claim in text
    assert f"The claims judged are those `{declaring}` lists (as read when this report was made)" in text
    with pytest.raises(ValueError, match="claims_from=nowhere.yaml: no such experiment file"):
        ReportConfig(out_dir=str(plain), also=sources, claims_from="nowhere.yaml")
    with pytest.raises(ValueError, match="give claims= or claims_from=, not both"):
        ReportConfig(out_dir=str(plain), also=sources, claims=[], claims_from=str(declaring))


def test_a_claim_s_seed_is_dated_by_the_rows_it_reads(tmp_path):
    """Seeds 1 and 2 ran on 2026-11-26; a file run on 2026-11-29 added ``headscale past 4x`` to seed 1. The
    seed's first run dates seed 1 before a rule of 2026-11-28; the rows a claim reads date it by them."""
    first, added = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(to_yaml(PipelineConfig(name="a", seeds=[1, 2], steps=[EVAL])))
    past = PipelineStep(id="eval_past", stage="evaluate", label="headscale past 4x")
    added.write_text(to_yaml(PipelineConfig(name="b", seeds=[1], steps=[PRETRAIN, past])))
    dates = {"a": "2026-11-26", "b": "2026-11-29"}
    rows = row_days([first, added], ["a", "b"], dates)
    assert rows == {("nope", 1): "2026-11-26", ("nope", 2): "2026-11-26", ("pretrain_nope", 1): "2026-11-29",
                    ("headscale past 4x", 1): "2026-11-29"}
    seeds = {1: "2026-11-26", 2: "2026-11-26"}
    both = dataclasses.replace(CLAIMS_BY_ID["headscale_past_beats_nope_4x"],
                               changes=(RuleChange("2026-11-28", "a rule set between the two runs"),))
    claim = dataclasses.replace(both, methods=("headscale past 4x",))
    assert read_days(claim, seeds, rows) == {1: "2026-11-29", 2: "2026-11-26"}  # seed 2 reads none: its own day
    assert read_days(claim, seeds) == seeds  # without row days: as before
    assert set(both.methods) == {"headscale past 4x", "nope"}
    assert read_days(both, seeds, rows)[1] == "2026-11-26"  # the NoPE row it also reads was made before
    judged = Outcome(claim, "reproduced", seeds=(1,))
    assert exploratory_note(judged, seeds).startswith("*exploratory*")
    assert exploratory_note(judged, read_days(claim, seeds, rows)) == ""
    assert exploratory_note(Outcome(both, "reproduced", seeds=(1,)), read_days(both, seeds, rows)) != ""


def test_fig5_s_rule_reads_the_days_of_its_own_rows():
    rng = np.random.default_rng(1)
    entropy = rng.uniform(1, 5, (3, 4))
    runs = {PERMUTATION_CLAIM.methods[0]: {s: headscale((4.0 - 0.5 * entropy).tolist(), entropy.tolist())
                                           for s in SEEDS},
            PERMUTATION_CLAIM.methods[1]: {s: untuned_run(entropy) for s in SEEDS}}
    before = {s: "2026-11-27" for s in SEEDS}
    assert "*exploratory*" in fig5_section(runs, before)
    after = {(m, s): "2026-11-29" for m in PERMUTATION_CLAIM.methods for s in SEEDS}
    assert "*exploratory*" not in fig5_section(runs, before, after)


def test_table2_has_a_table_per_corpus_and_pairs_only_methods_on_the_reference_s(tmp_path):
    runs = {"nope": {s: evaluation("nope", s) for s in (1, 2)},
            "nope lambda=1.5": {s: evaluation("nope lambda=1.5", s) for s in (1, 2)},
            "nope on math": {s: evaluation("nope on math", s, corpus="math") for s in (1, 2)}}
    rows = {"nope": "nope", "nope lambda=1.5": "nope lambda=1.5", "nope on math": "nope"}
    text = ppl_tables(runs, rows)
    kjv, math_table = text.split("### ")[1:]
    assert kjv.startswith("Sliding-window perplexity on `kjv`") and "paper column: PG19" in kjv
    assert math_table.startswith("Sliding-window perplexity on `math`") and "paper column: Proof-pile" in math_table
    assert "nope on math" not in kjv and "| nope |" in kjv and "| nope lambda=1.5 |" in kjv
    lines = [line for line in math_table.splitlines() if line.startswith("| nope")]
    assert len(lines) == 1 and lines[0].startswith("| nope on math |")
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[-1] == " / ".join(fmt(v) for v in TABLE2_PROOFPILE["nope"]) != " / ".join(
        fmt(v) for v in TABLE2_PG19["nope"])
    nll = [r.perplexity("math", 256).nll for r in runs["nope on math"].values()]
    assert cells[2].startswith(f"{math.exp(np.mean(nll)):.1f}")  # 256 tokens, the mean log-PPL over the seeds
    for table in (kjv, math_table):
        counts = {line.count("|") for line in table.splitlines() if line.startswith("|")}
        assert len(counts) == 1  # well-formed
    paired = paired_table(runs, 100, "nope")
    assert "| nope lambda=1.5 |" in paired and "nope on math" not in paired


def test_the_tuned_entropy_at_the_last_position_is_the_entropy_of_the_last_query():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, intermediate_size=32, max_positions=64, pos_encoding="nope")
    model = GPT(cfg, 50, train_len=8).eval()
    windows = torch.randint(0, 50, (3, 17))
    tail, last = converged_entropy(model, windows, chunk=5)
    assert tail.shape == last.shape == (2, 2)
    # Independently: every layer's full attention probabilities, their entropy per query, averaged over windows.
    expected = np.zeros((2, 2, 16))
    for window in windows:
        for layer in range(2):
            p = attention_probs(model, window[None, :-1], layer)[0].double()
            expected[layer] += -(p * torch.where(p > 0, p.log(), 0.0)).sum(-1).numpy() / len(windows)
    np.testing.assert_allclose(last.numpy(), expected[..., -1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tail.numpy(), expected[..., -2:].mean(-1), rtol=1e-4, atol=1e-5)  # 16 // 8 = 2
    assert not np.allclose(last.numpy(), tail.numpy())


def test_the_last_position_is_logged_read_back_and_drawn_when_present():
    rng = np.random.default_rng(2)
    entropy, last = rng.uniform(1, 5, (3, 4)), rng.uniform(1, 5, (3, 4))
    tuned = headscale((4.0 - 0.5 * entropy).tolist(), entropy.tolist())
    with_last = dataclasses.replace(tuned, converged_entropy=dataclasses.replace(
        tuned.converged_entropy, last_position=last.tolist()))
    assert HeadScaleResult.from_dict(with_last.to_dict()).converged_entropy.last_position == last.tolist()
    assert "last_position" not in tuned.to_dict()["converged_entropy"]  # an old file's form, read as None
    assert HeadScaleResult.from_dict(tuned.to_dict()).converged_entropy.last_position is None
    method = PERMUTATION_CLAIM.methods[0]
    np.testing.assert_allclose(views({method: {1: with_last}})["tuned"][1][1], last)
    np.testing.assert_allclose(views({method: {1: tuned}})["tuned"][1][1], entropy)
    figures = fig5_figures({method: {1: with_last}})
    caption = figures["fig5_tuned_by_layer.png"].caption
    assert "at the last position of T" in caption and "not at the last position alone" not in caption
    old = fig5_figures({method: {1: tuned}})["fig5_tuned_by_layer.png"].caption
    assert "over the last 1/8 of T" in old and "not at the last position alone" in old
    for plot in [*figures.values(), *fig5_figures({method: {1: tuned}}).values()]:
        plt.close(plot.figure)


def test_the_index_counts_a_result_read_twice_only_across_sources():
    index = ResultIndex()
    key = RunKey("search_nope", 1, (), "scale-search", "search_nope")
    assert index.add(key, "first", "bundle a", "abc") == dataclasses.replace(key, step="")
    assert index.add(key, "again", "run b", "abc") is None
    assert index.remeasured == [(dataclasses.replace(key, step=""), "bundle a", "run b")]
    assert index.at("scale-search", ()) == {"search_nope": {1: "first"}}
    with pytest.raises(ValueError, match="bundle a and bundle a both hold"):
        index.add(key, "twice", "bundle a", "abc")  # one source's two runs of a step: which one is not ours to pick
    with pytest.raises(ValueError, match="both hold scale-search 'search_nope' seed 1: report each alone"):
        index.add(key, "unknown", "run c")  # no identity: as before
