"""The report's frame around its sections: a title naming the study, every figure with a caption saying what
it shows and over which seeds, the pre-training recipe of the models (``recipe_section``), and the provenance
(each pipeline run read, with its id, day and source) at the end, so that a report opens on what it studies
rather than on a line of run ids.

The study's name (``study_name``) is the ``_``-separated words every pipeline's name starts with: a study
split into files or seed slices names them after itself (``regime_study`` with ``regime_study_s5678``, …;
``synthetic_copy`` with ``synthetic_scan``, …), which is also its folder ``experiments/<study>``; pipelines
sharing no first word are named by the first one read. A first pipeline that is one of a file's seed slices
(``<file>_s<seed>``, or the file itself, with other slices read) names the study after that file, whatever
companion files are read beside it (``regime_rope_s1234``, RoPE's baselines, beside ``regime_study``'s slices).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from nope_lightning.analysis.markdown import MISSING, markdown_table, render
from nope_lightning.results.bundle import Recipe


class Plot(NamedTuple):
    """A figure the report draws (``None``: nothing to draw) and the caption printed under it."""

    figure: Any
    caption: str


def study_name(pipelines: Sequence[tuple[str, str]]) -> str:
    """The study a report's ``(pipeline name, run id)`` pairs belong to (the module's rule)."""
    slices = [re.sub(r"_s\d+$", "", name) for name, _ in pipelines]
    mine = [name for (name, _), stem in zip(pipelines, slices, strict=True) if stem == slices[0]]
    if len(mine) > 1 and any(name != slices[0] for name in mine):
        return slices[0]
    names = [name.split("_") for name, _ in pipelines]
    shared = []
    for words in zip(*names, strict=False):  # up to the shortest name
        if len(set(words)) > 1:
            break
        shared.append(words[0])
    return "_".join(shared) or pipelines[0][0]


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``"1 task"``, ``"2 tasks"``; ``many`` where adding an s is wrong (``plural(2, "query", "queries")``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def heading(pipelines: Sequence[tuple[str, str]]) -> str:
    """The title and one line on what was read; the run ids wait for the provenance section."""
    files = len(dict.fromkeys(name for name, _ in pipelines))
    return (f"# Report: {study_name(pipelines)}\n\nRead from {plural(len(pipelines), 'pipeline run')} "
            f"of {plural(files, 'experiment file')}; their names, run ids and sources are under "
            "*Provenance*, at the end.")


def seeds(values: Iterable[int | None]) -> str:
    """'seed 1234', 'seeds 1234, 2345' (sorted, once each), or what a run without a replicate seed is."""
    found = sorted({v for v in values if v is not None})
    if not found:
        return "one run (no replicate seed)"
    return f"seed{'s' * (len(found) > 1)} {', '.join(map(str, found))}"


def over_seeds(by_name: Mapping[str, Iterable[int | None]]) -> str:
    """'mean over seeds 1, 2, 3' for curves or cells averaged per name (method, panel) over its seeds, naming
    the names that hold fewer seeds than the figure as a whole: a band over 2 seeds is not one over 8."""
    held = {name: frozenset(found) for name, found in by_name.items()}
    every = frozenset().union(*held.values())
    text = f"{'mean over ' if len(every - {None}) > 1 else ''}{seeds(every)}"
    fewer: dict[frozenset, list[str]] = {}
    for name, found in held.items():
        if found != every:
            fewer.setdefault(found, []).append(f"`{name}`")
    exceptions = "; ".join(f"{_and(names)}: {seeds(found)} only" for found, names in fewer.items())
    return text + (f" ({exceptions})" if exceptions else "")


def _and(names: Sequence[str]) -> str:
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def plots_section(names: Sequence[str], captions: Mapping[str, str]) -> str:
    """Each figure's image, then its numbered caption ('' without figures)."""
    if not names:
        return ""
    return "## Plots\n\n" + "\n\n".join(f"![{name}]({name})\n\n*Figure {n}. {captions[name]}*"
                                        for n, name in enumerate(names, 1))


def provenance_section(runs: Sequence[tuple[str, str, str]], dates: Mapping[str, str],
                       machines: Mapping[str, str] | None = None) -> str:
    """Every ``(pipeline name, run id, where it was read from)``, in the order read, with the day it ran and,
    when any run recorded them, the machines that ran it (``machines``: run id -> its machine tag; a run made
    before runs were tagged reads "not recorded"): one table per source (a bundle holds many runs)."""
    machines = machines or {}
    columns = ["pipeline", "run id", "ran (UTC day)", *(["machine"] if machines else [])]
    by_origin: dict[str, list[list[str]]] = {}
    for name, run_id, origin in runs:
        by_origin.setdefault(origin, []).append([f"`{name}`", run_id, dates.get(run_id, MISSING),
                                                 *([machines.get(run_id, "not recorded")] if machines else [])])
    return ("## Provenance\n\nThe pipeline runs this report read, in the order read; the title names their "
            "study by the words all their names start with (by the first one's name when they share "
            "none).\n\n"
            + "\n\n".join(f"From the {origin}:\n\n" + render(columns, rows) for origin, rows in by_origin.items()))


RECIPE_KEYS = ("model.pos_encoding", "model.ssmax", "model.n_layer", "model.n_embd", "data.corpus", "train_len",
               "batch_size", "trainer.devices", "trainer.max_steps", "tokens_per_parameter", "optim.lr",
               "optim.min_lr_ratio", "retrieval.fraction", "retrieval.length", "seed")


def recipe_section(pretrains: Sequence[Recipe]) -> str:
    """Which pre-training recipe produced the models: every figure above depends on it. An unset setting arrives
    as the string "None" (MLflow logs params as strings) and is printed as not set."""
    if not pretrains:
        return ""
    rows = [[r.name, *[MISSING if r.params.get(k, "None") == "None" else r.params[k] for k in RECIPE_KEYS]]
            for r in pretrains]
    return ("### Pre-training recipe of the models above\n\n" + markdown_table(["run", *RECIPE_KEYS], rows)
            + "\n\nA retrieval fraction above 0 means passkey sequences were mixed into pre-training (off in "
              "the paper's recipe): passkey figures of such models measure a skill the model was taught inside "
              "L, and how far past L it survives.")
