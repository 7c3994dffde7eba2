"""RoPE's baselines beside NoPE in a study report whose RoPE rows come from files (bundles) of their own, with fewer
seeds: the baselines table's numbers against a direct computation, Fig 2 right and Fig 6 as curves drawn and
named, the NoPE-against-RoPE claims judged on the seeds both sources hold (paired by seed), Table 2's paper column
chosen by the corpus's named mapping, and a NoPE-only report without any of it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.analysis.lengthgen.baselines import baseline_sections, baselines_table
from nope_lightning.analysis.lengthgen.plots import FIXED_SLOTS, FREE, method_style, plt, seed_lines
from nope_lightning.analysis.lengthgen.study_claims import study_claims
from nope_lightning.analysis.lengthgen.tables import TABLE2_BY_CORPUS, ppl_tables
from nope_lightning.analysis.sources import Methods
from nope_lightning.config.core import to_yaml
from nope_lightning.config.paper import TABLE2_PG19, TABLE2_PROOFPILE, fmt
from nope_lightning.config.pipeline import PipelineConfig, PipelineStep, ReportConfig, ReportSource
from nope_lightning.results import EvaluationResult, ScaleSearchResult, SearchTrial
from nope_lightning.results.bundle import Bundle, Placed
from nope_lightning.results.runkey import RunKey
from nope_lightning.stages import report

L, S, WINDOWS = 128, 64, 40
MULTIPLES = (1, 2, 4, 8)
GRID = (0.8, 1.0, 1.2, 1.4)


def nll_windows(method: str, seed: int, multiple: int) -> np.ndarray:
    """Per window, the mean NLL a method scores at ``multiple`` x L: RoPE breaks past L, NoPE degrades slowly."""
    rng = np.random.default_rng([seed, multiple, *map(ord, method)])
    rise = {"rope": 1.5, "nope": 0.3}.get(method, 0.1) * math.log2(multiple)
    return 3.0 + 0.05 * seed + rise + rng.normal(0.0, 0.2, WINDOWS)


def evaluation(method: str, seed: int, corpus: str = "kjv", passkey: dict[int, float] | None = None) -> EvaluationResult:
    """An evaluate result: PPL per length (its log-PPL the windows' pooled mean, a made-up bootstrap interval of
    +-0.05), the windows behind it, and passkey prompts (10 per length, ``passkey``: accuracy per multiple)."""
    ppl, windows = {}, {"doc": [i // 10 for i in range(WINDOWS)], "end": list(range(WINDOWS))}
    for m in MULTIPLES:
        nll = nll_windows(method, seed, m)
        windows[str(m * L)] = np.stack([nll * S, np.full(WINDOWS, float(S))], 1).tolist()
        mean = float(nll.mean())
        ppl[str(m * L)] = {"ppl": math.exp(mean), "nll": mean, "tokens": WINDOWS * S, "nll_low": mean - 0.05,
                           "nll_high": mean + 0.05}
    result = {"train_len": L, "corpora": [corpus], "split": "test", "stride": 64, "lengths": [m * L for m in MULTIPLES],
              "ppl": {corpus: ppl}, "windows": {corpus: windows}}
    if passkey is not None:
        samples = [[m * L, 0.0, str(10000 + i), i < round(10 * a)] for m, a in passkey.items() for i in range(10)]
        result["passkey"] = {"prompt": "compact", "samples": samples,
                             "by_length": {str(m * L): a for m, a in passkey.items()}}
    return EvaluationResult.from_dict(result)


def search(seed: int, best: float) -> ScaleSearchResult:
    """A uniform-temperature search whose validation log-PPL at 2x and 4x is least at ``best``."""
    trials = [SearchTrial(lam, {n: 3.5 + 0.05 * seed + (lam - best) ** 2 * n / L for n in (2 * L, 4 * L)})
              for lam in GRID]
    return ScaleSearchResult(train_len=L, best={2 * L: best, 4 * L: best}, grid=(GRID[0], GRID[-1]), trials=trials)


NOPE_SEEDS, ROPE_SEEDS = (1, 2, 3), (2, 3)
PASSKEY = {"nope": {1: 1.0, 2: 0.7}, "rope": {1: 1.0, 2: 0.0}}
METHODS = Methods(reference="nope", rows={"table2": {"nope": "nope", "rope": "rope", "pi fair 2x": "pi fair 2x"}},
                  nope_family=frozenset({"nope", "nope lambda=1.5"}))


def runs() -> dict:
    """NoPE's rows on 3 seeds, RoPE's on 2, a fine-tuned baseline on 1."""
    return {"nope": {s: evaluation("nope", s, passkey=PASSKEY["nope"]) for s in NOPE_SEEDS},
            "nope lambda=1.5": {s: evaluation("nope lambda=1.5", s) for s in NOPE_SEEDS},
            "rope": {s: evaluation("rope", s, passkey=PASSKEY["rope"]) for s in ROPE_SEEDS},
            "pi fair 2x": {2: evaluation("pi fair 2x", 2)}}


def row(table: str, method: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("| ").split(" | ")]


def test_the_baselines_table_is_each_row_over_its_own_seeds_beside_the_paper():
    table = baselines_table(runs(), METHODS)
    assert table.startswith("### Baselines beside NoPE (Table 2 analog on `kjv`")
    assert "paper column: PG19" in table
    # rope: the mean log-PPL over its 2 seeds and its 95 % t interval (df = 1), shown as PPL
    for n, m in enumerate(MULTIPLES):
        logs = [nll_windows("rope", s, m).mean() for s in ROPE_SEEDS]
        low, high = scipy_stats.t.interval(0.95, 1, loc=np.mean(logs), scale=scipy_stats.sem(logs))
        assert row(table, "rope")[2 + n] == f"{fmt(math.exp(np.mean(logs)))} [{fmt(math.exp(low))}, {fmt(math.exp(high))}]"
    assert row(table, "rope")[1] == "2" and row(table, "rope")[-1] == " / ".join(map(fmt, TABLE2_PG19["rope"]))
    # one seed: its run's own interval
    one = nll_windows("pi fair 2x", 2, 2).mean()
    assert row(table, "pi fair 2x")[1] == "1"
    assert row(table, "pi fair 2x")[3] == f"{fmt(math.exp(one))} [{fmt(math.exp(one - 0.05))}, {fmt(math.exp(one + 0.05))}]"
    logs = [nll_windows("nope", s, 1).mean() for s in NOPE_SEEDS]
    assert row(table, "nope")[1] == "3" and row(table, "nope")[2].startswith(fmt(math.exp(np.mean(logs))))
    assert "| nope lambda=1.5 |" not in table  # a NoPE row beside no row of Table 2 is not a comparison row
    assert "Baselines: `rope`, `pi fair 2x`, mean over seeds 2, 3 (`pi fair 2x`: seed 2 only)" in table
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len({line.replace("\\|", "").count("|") for line in lines}) == 1  # well-formed


def test_a_nope_row_on_the_second_corpus_only_stays_out_of_the_baselines_table():
    math_rows = {"table2": {**METHODS.rows["table2"], "nope on math": "nope"}}
    methods = Methods(reference="nope", rows=math_rows, nope_family=frozenset({"nope", "nope on math"}))
    evals = {**runs(), "nope on math": {s: evaluation("nope on math", s, corpus="math") for s in NOPE_SEEDS}}
    table = baselines_table(evals, methods)
    assert "| nope |" in table and "nope on math" not in table


def test_a_nope_only_study_gets_no_baselines_section_nor_figure():
    nope_only = {m: by_seed for m, by_seed in runs().items() if m in METHODS.nope_family}
    text, figures = baseline_sections(nope_only, {"search_nope": {1: search(1, 1.2)}}, METHODS)
    assert text == "" and figures == {}


def test_table2_s_paper_column_is_named_per_corpus_and_absent_for_an_unknown_one():
    assert TABLE2_BY_CORPUS["kjv"] == ("PG19", TABLE2_PG19)
    assert TABLE2_BY_CORPUS["math"] == ("Proof-pile", TABLE2_PROOFPILE)
    math_table = ppl_tables({"nope": {1: evaluation("nope", 1, corpus="math")}}, {"nope": "nope"})
    assert "paper column: Proof-pile" in math_table and " / ".join(map(fmt, TABLE2_PROOFPILE["nope"])) in math_table
    code = ppl_tables({"nope": {1: evaluation("nope", 1, corpus="code")}}, {"nope": "nope"})
    assert "no paper column: paper 001 measured no corpus like `code`" in code
    assert "paper 1x" not in code and fmt(TABLE2_PG19["nope"][1]) not in code


def test_claims_only_files_together_can_judge_are_added_once():
    nope = PipelineConfig(name="toy", claims=["large_temperature_hurts_1x"],
                          steps=[PipelineStep(id="eval_nope", stage="evaluate", label="nope"),
                                 PipelineStep(id="eval_nope_15", stage="evaluate", label="nope lambda=1.5")])
    rope = PipelineConfig(name="toy_rope", claims=["ntk_flat_in_both"],
                          steps=[PipelineStep(id="eval_rope", stage="evaluate", label="rope")])
    ids = study_claims(nope.claims, [nope, rope])
    assert ids[:2] == ["large_temperature_hurts_1x", "ntk_flat_in_both"]
    assert {"nope_matches_rope_in_distribution", "nope_degrades_later", "nope_retrieves_past_L"} <= set(ids[2:])
    assert study_claims(nope.claims, [nope, nope]) == nope.claims  # seed slices: their own claims only


def write_bundle(folder, name: str, run_id: str, config: PipelineConfig, placed: list[Placed]):
    path = folder.parent / f"{name}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(to_yaml(config))
    return Bundle([(name, run_id)], [path], placed, dates={run_id: "2026-11-28"}).write(folder)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The report over a NoPE bundle (seeds 1-3) and a RoPE bundle (seeds 2, 3), as the study's is made."""
    root = tmp_path_factory.mktemp("study")
    nope_steps = [PipelineStep(id="eval_nope", stage="evaluate", label="nope", family="nope",
                               paper={"table2": "nope"}), PipelineStep(id="search_nope", stage="scale-search")]
    rope_steps = [PipelineStep(id="eval_rope", stage="evaluate", label="rope", paper={"table2": "rope"}),
                  PipelineStep(id="search_rope", stage="scale-search")]
    data = runs()
    nope = write_bundle(root / "nope" / "results", "toy_study", "a" * 32,
                        PipelineConfig(name="toy_study", seeds=list(NOPE_SEEDS), reference="nope", steps=nope_steps),
                        [*(Placed(RunKey("nope", s, (), "evaluate", "eval_nope"), f"nope-{s}", data["nope"][s])
                           for s in NOPE_SEEDS),
                         *(Placed(RunKey("search_nope", s, (), "scale-search", "search_nope"), f"sn-{s}",
                                  search(s, 1.2)) for s in NOPE_SEEDS)])
    rope = write_bundle(root / "rope" / "results", "toy_rope_s2", "b" * 32,
                        PipelineConfig(name="toy_rope_s2", seeds=list(ROPE_SEEDS), reference="rope",
                                       claims=["ntk_flat_in_both"], steps=rope_steps),
                        [*(Placed(RunKey("rope", s, (), "evaluate", "eval_rope"), f"rope-{s}", data["rope"][s])
                           for s in ROPE_SEEDS),
                         *(Placed(RunKey("search_rope", s, (), "scale-search", "search_rope"), f"sr-{s}",
                                  search(s, 1.0)) for s in ROPE_SEEDS)])
    out = root / "report"
    report.run(ReportConfig(out_dir=str(out), bootstrap=200,
                            also=[ReportSource(results=str(nope)), ReportSource(results=str(rope))]))
    return out, (out / "report.md").read_text()


def test_the_study_report_draws_fig_2_right_and_fig_6_and_names_them(study):
    out, text = study
    assert "### Baselines beside NoPE" in text
    for name in ("search_ppl_vs_lambda.png", "passkey_by_length.png"):
        assert (out / name).stat().st_size > 0
        caption = re.search(rf"!\[{re.escape(name)}\]\({re.escape(name)}\)\n\n\*Figure \d+\. (.*)\*", text).group(1)
        assert re.search(r"\bseeds? \d", caption), caption
    assert "searches `search_nope`, `search_rope`" in text
    assert "thick: the mean log-PPL shown as PPL, mean over seeds 1, 2, 3 (`search_rope`: seeds 2, 3 only)" in text
    assert "of `nope`, `rope`; thin: one seed each; thick: mean over seeds 1, 2, 3 (`rope`: seeds 2, 3 only)" in text
    # each search's own figures, the first's under the names a study of one search gives them
    assert {p.name for p in out.glob("lambda_fit*.png")} == {"lambda_fit_s1.png", "lambda_fit_s2.png", "lambda_fit_s3.png",
                                                             "lambda_fit_search_rope_s2.png", "lambda_fit_search_rope_s3.png"}


def claim_row(text: str, start: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {start}"))
    return [c.strip() for c in line.strip("| ").split(" | ")]


def test_nope_against_rope_claims_pair_seeds_across_the_two_sources(study):
    _, text = study
    # log-PPL at 1x, NoPE minus RoPE, on the seeds both sources hold (2 and 3), from the windows directly
    effects = [nll_windows("nope", s, 1).mean() - nll_windows("rope", s, 1).mean() for s in ROPE_SEEDS]
    cells = claim_row(text, "NoPE is on par with RoPE within L")
    assert f"(per seed: {effects[0]:+.3f} / {effects[1]:+.3f})" in cells[5]
    assert cells[-1] == "**2 seeds: no verdict (fewer than 5)**"
    rise = [(nll_windows("rope", s, 2).mean() - nll_windows("rope", s, 1).mean())
            - (nll_windows("nope", s, 2).mean() - nll_windows("nope", s, 1).mean()) for s in ROPE_SEEDS]
    assert f"(per seed: {rise[0]:+.3f} / {rise[1]:+.3f})" in claim_row(text, "NoPE degrades later than RoPE")[5]
    retrieves = claim_row(text, "NoPE retrieves the passkey past L")
    assert "(per seed: +0.700 / +0.700)" in retrieves[5]
    assert "RoPE-NTK is flat in both" in text and "not measured" in claim_row(text, "RoPE-NTK is flat in both")[-1]


def test_companion_files_beside_a_seed_sliced_study_keep_its_name():
    from nope_lightning.analysis.report_frame import study_name

    slices = [("regime_study_s8901", "a"), ("regime_study", "b")]
    assert study_name([*slices, ("regime_rope_s1234", "c"), ("regime_rope_s2345", "d")]) == "regime_study"
    assert study_name([("regime_study_s5678", "a")]) == "regime_study_s5678"  # one slice alone: its own name
    assert study_name([("synthetic_copy", "a"), ("synthetic_scan", "b")]) == "synthetic"


def test_fig_6_draws_prompt_lengths_evenly_spaced_so_lengths_just_inside_and_at_L_stay_apart():
    lines = {"nope": ([([122, 128, 256], [1.0, 0.9, 0.2]), ([122, 128, 256, 512], [1.0, 1.0, 0.3, 0.0])],
                      ([122, 128, 256], [1.0, 0.95, 0.25]))}
    fig = seed_lines({"left": lines, "right": {"rope": ([([128, 512], [0.3, 0.1])], ([128, 512], [0.3, 0.1]))}},
                     "prompt length", "accuracy", vline=128, ranked_x=True)
    left, right = fig.axes[:2]
    assert [t.get_text() for t in left.get_xticklabels()] == ["122", "128", "256", "512"]
    assert list(left.get_xticks()) == [0, 1, 2, 3]
    seed_line, _, mean_line, dashed = left.lines
    assert list(seed_line.get_xdata()) == [0, 1, 2] and list(mean_line.get_xdata()) == [0, 1, 2]
    assert list(right.lines[0].get_xdata()) == [1, 3]  # ranks among every panel's lengths
    assert list(dashed.get_xdata()) == [1, 1]  # L = 128 at its own rank
    plt.close(fig)


def test_methods_past_the_free_colours_take_the_lighter_shade_so_no_two_share_a_colour_until_three_cycles():
    labels = [f"fig 6 method {i}" for i in range(2 * len(FREE))]  # Fig 6 draws 10 beside nope, rope and alibi
    colours = [tuple(method_style(label)["color"]) for label in [*labels, *FIXED_SLOTS]]
    assert len(set(colours)) == len(colours)
    first, again = method_style(labels[0]), method_style(labels[len(FREE)])
    # one hue, another cycle: another line style and marker (slots are numbered per process, so not from 0 here)
    assert first["linestyle"] != again["linestyle"] and first["marker"] != again["marker"]
