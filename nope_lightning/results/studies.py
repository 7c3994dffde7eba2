"""The studies under ``experiments/``: one folder per study, holding its experiment file(s), a README and, once
run, ``results/`` (``report.md``, figures and the results bundle ``results/results``).

A study README opens with a front matter block (YAML between two ``---`` lines, which GitHub shows as a table)
that ``StudyCard`` reads: the question, the measured wall clock and where it was measured, and the committed
report's verdict counts. Everything else a listing shows is read from the folder itself: its experiment files and
their seeds (each file's ``seeds``), and whether results are committed (``results/report.md``) and with a bundle
(``results/results/index.json``, from which the report regenerates byte for byte).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nope_lightning.config.core import load_config
from nope_lightning.config.pipeline import PipelineConfig
from nope_lightning.results.bundle import INDEX, load_entry
from nope_lightning.results.runkey import RunKey

#: The verdicts a claim can get (``analysis/lengthgen/claims.py``; "too few tasks learned" is paper 002's,
#: ``analysis/synthetic/claims.py``; "not measured": the results hold none of what a claim reads; "no verdict":
#: too few seeds, however many), in the order a verdict count lists them.
VERDICTS = ("reproduced", "partial", "not reproduced", "inconclusive", "no verdict", "untestable",
            "too few tasks learned", "not measured")

#: A claims table's verdict cell, the row's last: the verdict in bold, then (*partial*) what it measured, or (a claim
#: judged on its new seeds) which seeds, in brackets.
VERDICT_CELL = re.compile(r"\| \*\*([^*|]+)\*\*(?:[:;][^|]*| \([^|]*\))? \|$")


@dataclass(frozen=True)
class StudyCard:
    """A study README's front matter.

    ``question``: what the study asks, one sentence. ``wall_clock_min``: minutes the committed results took from
    an empty store (summed over invocations and files); None when the study has not been run. ``machine``: where
    that was measured (cores or GPU, torch build). ``measured``: the date (ISO). ``verdicts``: the committed
    report's claim count per verdict (``VERDICTS``); empty for a study that tests no claims.
    """

    question: str
    wall_clock_min: float | None = None
    machine: str = ""
    measured: str = ""
    verdicts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise ValueError("question: empty")
        if self.wall_clock_min is not None and (self.wall_clock_min <= 0 or not self.machine):
            raise ValueError("wall_clock_min: must be > 0 minutes and name its machine")
        if unknown := sorted(set(self.verdicts) - set(VERDICTS)):
            raise ValueError(f"verdicts: unknown verdict(s) {unknown}; known: {', '.join(VERDICTS)}")

    def verdict_line(self) -> str:
        """``10 reproduced, 1 not reproduced, 2 untestable`` (the listed verdicts in ``VERDICTS`` order), or —."""
        return ", ".join(f"{self.verdicts[v]} {v}" for v in VERDICTS if self.verdicts.get(v)) or "—"

    def time_line(self) -> str:
        """``99.4 min, 2 CPU cores ...``; the machine alone, or ``not measured``, without a wall clock."""
        if self.wall_clock_min is None:
            return self.machine or "not measured"
        return f"{self.wall_clock_min:g} min, {self.machine}"


def verdict_of(cell: str) -> str | None:
    """The ``VERDICTS`` entry a verdict cell's bold text counts under: itself, or "no verdict" for every
    too-few-seeds verdict ("1 seed: no verdict about seeds", "4 seeds: no verdict (fewer than 5)"); None for a
    bold cell that is no verdict."""
    if cell in VERDICTS:
        return cell
    return "no verdict" if "no verdict" in cell else None


def verdict_counts(tables: str) -> dict[str, int]:
    """How many rows of markdown ``tables`` end on a verdict cell, per verdict (``verdict_of``)."""
    return dict(Counter(verdict for line in tables.splitlines() if (match := VERDICT_CELL.search(line))
                        and (verdict := verdict_of(match.group(1))) is not None))


@dataclass(frozen=True)
class StudyFile:
    """One experiment file of a study: its path and the seeds it runs (its ``seeds``; empty: the stages' own)."""

    path: Path
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class Study:
    """One folder under ``experiments/``: its card, experiment files (sorted by name) and scripts."""

    folder: Path
    card: StudyCard
    files: tuple[StudyFile, ...]
    scripts: tuple[Path, ...]

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def seeds(self) -> tuple[int, ...]:
        """Every seed any of its files runs, sorted."""
        return tuple(sorted({seed for f in self.files for seed in f.seeds}))

    @property
    def reported_seeds(self) -> tuple[int, ...]:
        """The seeds the study's committed bundles hold results of, sorted; () without one. Every bundle counts
        (``results/results``, and any other report's, as the race's six seeds pooled in ``all_seeds/results``
        beside its new seeds' ``results/results``): each result's ``seed`` tag, or for a synthetic grid placed
        without one (a grid that runs its own seeds, e.g. a matrix of seed pairs) the seeds of its cells."""
        seeds: set[int] = set()
        for index in self.folder.glob(f"**/results/{INDEX}"):
            # The index alone where its tags tell (Bundle.read would decompress every result)
            for entry in json.loads(index.read_text())["results"]:
                key = RunKey.from_tags(entry["tags"], entry["run_name"])
                if key.seed is not None:
                    seeds.add(key.seed)
                elif key.stage == "synthetic-grid":
                    seeds |= {cell.seed for cell in load_entry(index.parent, entry).result.runs}
        return tuple(sorted(seeds))

    def seed_count(self) -> str:
        """``4 of 8`` while the committed results hold fewer seeds than the files run, else the count (— for none).
        A seed the results hold counts as run even where no file lists it: a slice may name its own
        (``"seeds=[4]"`` on the command line)."""
        reported = set(self.reported_seeds)
        planned = reported | set(self.seeds)
        if self.status == "results + bundle" and len(reported) < len(planned):
            return f"{len(reported)} of {len(planned)}"
        return str(len(planned) or "—")

    @property
    def status(self) -> str:
        """``results + bundle``, ``results`` (a report without a bundle: it cannot be regenerated) or
        ``no results``."""
        if not (self.folder / "results/report.md").is_file():
            return "no results"
        return "results + bundle" if (self.folder / "results/results" / INDEX).is_file() else "results"


def front_matter(text: str) -> dict:
    """The YAML mapping between a leading ``---`` line and the next one; ValueError when there is none."""
    lines = text.splitlines()
    if not lines or lines[0] != "---" or "---" not in lines[1:]:
        raise ValueError("no front matter (a leading block between two '---' lines)")
    try:  # every scalar as text (a date stays ISO text; the card's types convert the numbers)
        block = yaml.load("\n".join(lines[1:lines.index("---", 1)]), Loader=yaml.BaseLoader)
    except yaml.YAMLError as err:
        raise ValueError(f"the front matter is not YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(block, dict):
        raise ValueError("the front matter must be a mapping of keys")
    return block


def read_card(readme: Path) -> StudyCard:
    """The ``StudyCard`` of a study README; ValueError naming the file for a missing, unknown or mistyped key."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(StudyCard), front_matter(readme.read_text()))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ValueError(f"{readme}: {str(err).splitlines()[0]}") from None
    except ValueError as err:
        raise ValueError(f"{readme}: {err}") from None


def read_study(folder: Path) -> Study:
    """The study in ``folder``: its README's card, each ``*.yaml`` as a pipeline file, each ``*.py`` a script."""
    readme = folder / "README.md"
    if not readme.is_file():
        raise ValueError(f"{folder}: a study folder needs a README.md with its card")
    files = tuple(StudyFile(path, tuple(load_config(PipelineConfig, path).seeds))
                  for path in sorted(folder.glob("*.yaml")))
    return Study(folder, read_card(readme), files, tuple(sorted(folder.glob("*.py"))))


def find_studies(experiments: Path) -> list[Study]:
    """Every study folder under ``experiments``, by name."""
    if not experiments.is_dir():
        raise FileNotFoundError(f"no folder {experiments} (run from the repository root)")
    return [read_study(folder) for folder in sorted(experiments.iterdir()) if folder.is_dir()]


def listing(studies: list[Study]) -> str:
    """``nope-lightning studies``: per study its status and time, its question, then one line per file."""
    blocks = []
    for study in studies:
        lines = [f"{study.name}  [{study.status}, seeds {study.seed_count()}]  {study.card.time_line()}",
                 f"  {study.card.question}"]
        lines += [f"  {f.path}  seeds: {', '.join(map(str, f.seeds)) or 'none (the stages own)'}"
                  for f in study.files]
        lines += [f"  {script}  (script)" for script in study.scripts]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def results_table(studies: list[Study], base: str = "experiments") -> str:
    """The front door's results table: one row per study (question, number of seeds: with results of those the
    files run, status, verdict counts, wall clock), each linking its README under ``base``."""
    rows = ["| study | question | seeds | status | verdicts | wall clock |", "|---|---|---|---|---|---|"]
    rows += [f"| [{s.name}]({base}/{s.name}/README.md) | {s.card.question} | {s.seed_count()} | {s.status} "
             f"| {s.card.verdict_line()} | {s.card.time_line()} |" for s in studies]
    return "\n".join(rows)
