"""Every committed report is what the code now makes of its committed bundle: each study's README promises that its
report command, run from a fresh clone, gives back the same report.md to the byte. A change to the report code that
changes a committed report's text fails here until the report is made again (and the READMEs citing it follow).
report.md is compared (it holds every table, verdict and figure caption); the figures' pixels are not, since they
depend on matplotlib's version and fonts."""

from __future__ import annotations

from pathlib import Path

import pytest

from nope_lightning.stages.registry import run_stage, stage_config
from tests.conftest import REPO

#: Each committed report folder, with the arguments its README's command adds to ``also=[{results: <its bundle>}]``.
COMMITTED = {
    "experiments/headscale_retrieval/results": [],
    "experiments/hybrids/results": [],
    "experiments/regime_study/results": ["claims_from=experiments/regime_study/regime_study.yaml"],
    "experiments/synthetic/results": [],
    "experiments/synthetic_race/results": [],
    "experiments/synthetic_race/all_seeds": [],
    "experiments/synthetic_race_cap/results": [],
    "experiments/synthetic_race_floor/results": [],
    "experiments/synthetic_race_scratchpad/results": [],
}


def test_every_committed_bundle_has_its_report_listed_here():
    bundles = {str(p.parent.relative_to(REPO)) for p in REPO.glob("experiments/**/results/index.json")}
    assert {str(Path(folder) / "results") for folder in COMMITTED} == bundles


@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_a_committed_report_is_made_again_to_the_byte_from_its_bundle(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the bundle's path as the README's command names it, which the provenance prints
    store = [f"tracking.uri=sqlite:///{tmp_path}/store/mlflow.db", f"tracking.artifact_root={tmp_path}/store/a"]
    args = [f"also=[{{results: {folder}/results}}]", *COMMITTED[folder], *store, f"out_dir={tmp_path}/report"]
    made = Path(run_stage("report", stage_config("report", None, args))["markdown"])
    committed = REPO / folder
    again = " ".join(["nope-lightning run report", f'"also=[{{results: {folder}/results}}]"', *COMMITTED[folder],
                      f"out_dir={folder}"])
    assert made.read_text() == (committed / "report.md").read_text(), (
        f"{folder}/report.md is stale: make it again with `{again}`")
    assert sorted(p.name for p in made.parent.glob("*.png")) == sorted(p.name for p in committed.glob("*.png"))
