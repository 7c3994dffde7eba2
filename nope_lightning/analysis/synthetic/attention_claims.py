"""Paper 002's attention claim (Kazemnejad et al. 2023, §6 and Fig 4: NoPE's attention is most similar to T5's),
tested on synthetic-grid attention analyses with ``claims``' types and ``verdicts.verdict``, and the per-layer
JSD table it is read against.

Input: the ``SyntheticGridResult``s of one or more grids (a study may spread its tasks or seeds over several files),
each (task, seed) in one of them; grids run with a scratchpad are not read (they analyse other sequences). Per (task,
seed) and PE (paper name): its per-layer min-head Jensen–Shannon divergence to the NoPE model of the same seed (nats,
0 <= JSD <= ln 2), mean over the analysed lengths, ID and OOD (``TaskAttention.by_seed``); and the NoPE-vs-NoPE floor,
NoPE of that seed against NoPE of the grid's previous seed on the same inputs (``floor_by_seed``;
``analysis.synthetic.grid.floor_partner``: a grid's first seed has none).

Choices:

* **Statistic**, per seed: the smallest of ALiBi's, Rotary's and APE's JSD to NoPE minus T5's, each the mean over
  layers (each layer weighing the same, as Fig 4's right panel). > 0: T5 is the closest; an ordering, so the threshold
  is 0, as for the MRR claims. The closest rival is picked per seed, which errs against T5 (``claims``' best
  rival).
* **Task**: SCAN, the paper's; where no grid analysed it, the mean over every analysed task of each seed's effect, the
  claims table saying so (SCAN "left out").
* **Verdict**: ``verdicts.verdict`` on the Student t interval (df = n - 1) across the seeds every task used has; one
  seed gets none. There is no evaluation-only interval: the analysis keeps per-length means, not per-example JSDs.
* **The floor is reported beside the claim** (``attention_table``: the floor per layer and T5 minus it, each with its
  interval), not a precondition: (1) a PE's model shares its seed's initial weights and batch order with that seed's
  NoPE, two NoPE seeds share neither, so a PE may lie below the floor by its seed alone: the floor scales "close",
  it is no level T5 must clear; (2) the t interval across seeds already carries NoPE's seed-to-seed spread of the
  paired statistic; (3) a study that runs one seed per grid (pipeline replicates) has no floor, yet its seeds still
  test the ordering.
* **No ID precondition**: the claim is about how the models attend, which the paper compares for every PE.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from nope_lightning.analysis.markdown import MISSING, cell, render
from nope_lightning.analysis.synthetic.claims import EXPLICIT, NONE, SyntheticClaim, SyntheticOutcome
from nope_lightning.analysis.synthetic.grid_plots import FLOOR
from nope_lightning.analysis.verdicts import NotMeasured, verdict
from nope_lightning.config.synthetic import PAPER_NAMES
from nope_lightning.numerics.stats import Interval, prediction_interval, t_interval
from nope_lightning.results.synthetic import SyntheticGridResult

JSD_RANGE = (0.0, math.log(2))  # nats: where a JSD lies, so its t interval is clipped to it
RIVALS = ("alibi", "rope", "sinusoidal")  # the explicit PEs T5 is measured against

T5_CLOSEST = SyntheticClaim(
    "t5_attention_closest_to_nope", "NoPE's attention is closest to T5's among the explicit PEs (per seed: the "
    "smallest of ALiBi's, Rotary's and APE's min-head JSD to NoPE minus T5's, each the mean over layers and lengths; "
    "read against the NoPE-vs-NoPE floor of the attention table)",
    "Fig 4 (SCAN): NoPE's attention \"mostly resembles T5's relative PE attention patterns\"", "attention_margin",
    ("t5", *RIVALS), unit="(nats)", rivals=RIVALS, tasks=("scan",))
ATTENTION_CLAIMS: tuple[SyntheticClaim, ...] = (T5_CLOSEST,)


class SeedJSD(NamedTuple):
    """One (task, seed): per PE (paper name) its per-layer JSD to NoPE (n_layer,) in nats, mean over the analysed
    lengths; the NoPE-vs-NoPE floor per layer (empty: none) and the seed whose NoPE it compared (None: none)."""

    pes: dict[str, list[float]]
    floor: list[float]
    partner: int | None


def attention_index(grids: Iterable[SyntheticGridResult]) -> dict[str, dict[int, SeedJSD]]:
    """task -> seed -> its ``SeedJSD``, from every grid's attention analysis without a scratchpad (as the other
    PE-vs-PE claims: a scratchpad grid analyses other sequences; a grid without per-seed values, written before them,
    adds nothing); a (task, seed) in two grids is a ``ValueError``."""
    index: dict[str, dict[int, SeedJSD]] = defaultdict(dict)
    for grid in grids:
        padded = {r.task for r in grid.runs if r.scratchpad != NONE}
        for task, a in grid.attention.items():
            if task in padded:
                continue
            for seed, pes in a.by_seed.items():
                if seed in index[task]:
                    raise ValueError(f"two attention analyses of ({task}, seed {seed}); the second in grid "
                                     f"{grid.parent_run_id}")
                index[task][seed] = SeedJSD(pes, a.floor_by_seed.get(seed, []), a.floor_partners.get(seed))
    return dict(index)


def claim_tasks(claim: SyntheticClaim, index: dict[str, dict[int, SeedJSD]]
                ) -> tuple[list[str], list[tuple[str, str]]]:
    """The tasks ``claim`` reads: its own that the grids analysed, else every analysed task; and its own left out
    (task, why). ``NotMeasured`` when no grid holds per-seed attention values."""
    if not index:
        raise NotMeasured("no grid holds per-seed attention values (attention_examples_per_length = 0, or results "
                          "written before them)")
    if own := [t for t in claim.tasks if t in index]:
        return own, []
    return list(index), [(t, "not analysed by these grids; the effect is the mean over the analysed tasks")
                         for t in claim.tasks]


def layer_values(index: dict[str, dict[int, SeedJSD]], tasks: Sequence[str], seeds: Sequence[int],
                 pes: Sequence[str]) -> np.ndarray:
    """JSD to NoPE (seeds, tasks, PEs, layers) in nats, PEs by paper name; ``NotMeasured`` when one is missing or
    the layer counts differ (grids of different models)."""
    try:
        rows = [[[index[task][seed].pes[pe] for pe in pes] for task in tasks] for seed in seeds]
    except KeyError as missing:
        raise NotMeasured(f"{missing.args[0]} was not analysed in every (task, seed) of {', '.join(tasks)}") from None
    if len({len(layers) for by_task in rows for by_pe in by_task for layers in by_pe}) != 1:
        raise NotMeasured("the (task, seed)s have different numbers of layers: grids of different models")
    return np.asarray(rows, dtype=np.float64)


def closest_margin(values: np.ndarray) -> np.ndarray:
    """The claim's effect per seed from ``layer_values`` (seeds, tasks, PEs, layers), T5 first, then the rivals: per
    (seed, task), the smallest rival's mean over layers minus T5's, then the mean over tasks -> (seeds,)."""
    by_pe = values.mean(-1)  # (seeds, tasks, PEs)
    return (by_pe[..., 1:].min(-1) - by_pe[..., 0]).mean(-1)


def _closest(claim: SyntheticClaim, index: dict[str, dict[int, SeedJSD]]) -> SyntheticOutcome:
    tasks, left_out = claim_tasks(claim, index)
    if not (seeds := sorted(set.intersection(*(set(index[t]) for t in tasks)))):
        raise NotMeasured(f"no seed was analysed on every one of {', '.join(tasks)}")
    pes = [PAPER_NAMES[pe] for pe in claim.methods]
    per_seed = closest_margin(layer_values(index, tasks, seeds, pes))
    across = t_interval(per_seed)
    # no evaluation-only interval (module docstring): the estimate with NaN bounds, no resamples
    evaluation = Interval(across.estimate, math.nan, math.nan, per_seed=across.per_seed)
    return SyntheticOutcome(claim, verdict(claim, across), evaluation, tuple(seeds), across=across,
                            prediction=prediction_interval(per_seed), tasks=tuple(tasks), left_out=tuple(left_out))


def evaluate_attention_claims(grids: Iterable[SyntheticGridResult]) -> list[SyntheticOutcome]:
    """Each attention claim's outcome on ``grids`` (``tables.claims_table`` renders them); a claim whose
    values are missing is *not measured*, with the reason."""
    index, outcomes = attention_index(grids), []
    for claim in ATTENTION_CLAIMS:
        try:
            outcomes.append(_closest(claim, index))
        except NotMeasured as missing:
            outcomes.append(SyntheticOutcome(claim, "not measured", reason=str(missing)))
    return outcomes


# --- the per-layer table -----------------------------------------------------------------------------------------

T5_OVER_FLOOR = "T5 minus the floor"


def _row(label: str, values: np.ndarray, seeds: str, signed: bool = False) -> list[str]:
    """``label``, then per layer and for the mean over layers the mean over seeds [95 % t] of ``values`` (seeds,
    layers) in nats, then ``seeds``. A JSD's interval is clipped to [0, ln 2]; a ``signed`` difference's is not."""
    show, bounds = ("{:+.3f}".format, (-math.inf, math.inf)) if signed else ("{:.3f}".format, JSD_RANGE)
    columns = [*values.T, values.mean(-1)]
    return [label, *(cell(t_interval(c, bounds=bounds), show) for c in columns), seeds]


def task_table(task: str, by_seed: dict[int, SeedJSD]) -> str:
    """One task's per-layer JSD to NoPE: a row per PE analysed in every seed (the paper's order, then others; none in
    a grid of NoPE alone), the floor and T5 minus the floor (paired: each seed with a floor, its T5 minus its floor),
    each entry the mean over seeds [95 % t]. A floor has its seed's layers: its two NoPE models are of one grid, as
    are that seed's PEs."""
    seeds = sorted(by_seed)
    pes = [*(PAPER_NAMES[pe] for pe in EXPLICIT), *by_seed[seeds[0]].pes]
    pes = [pe for pe in dict.fromkeys(pes) if all(pe in by_seed[s].pes for s in seeds)]
    floored = [i for i, s in enumerate(seeds) if by_seed[s].floor]
    if not pes and not floored:
        raise NotMeasured("no PE was analysed against NoPE in every seed, and no seed has a floor")
    # A grid of NoPE alone (a floor study) has only the floor: its layer count is the floor's.
    values = (layer_values({task: by_seed}, [task], seeds, pes)[:, 0] if pes  # (seeds, PEs, layers)
              else np.empty((len(seeds), 0, len(by_seed[seeds[floored[0]]].floor))))
    rows = [_row(pe, values[:, p], str(len(seeds))) for p, pe in enumerate(pes)]
    if floored:
        floor = np.asarray([by_seed[seeds[i]].floor for i in floored])  # (seeds with a floor, layers)
        pairs = ", ".join(f"{seeds[i]} vs {by_seed[seeds[i]].partner}" for i in floored)
        rows.append(_row(FLOOR, floor, f"{len(floored)} of {len(seeds)}: {pairs}"))
        if (t5 := PAPER_NAMES["t5"]) in pes:
            rows.append(_row(T5_OVER_FLOOR, values[floored, pes.index(t5)] - floor, f"{len(floored)}, paired", True))
    else:
        rows.append([FLOOR, *[MISSING] * (values.shape[-1] + 1), "absent: no seed's floor was measured (a grid's "
                     "first seed has none, so a one-seed grid none at all; results before the floor have none)"])
    header = ["", *(f"layer {i + 1}" for i in range(values.shape[-1])), "mean over layers", "seeds"]
    return f"#### {task}\n\n" + render(header, rows)


def attention_table(grids: Iterable[SyntheticGridResult]) -> str:
    """The per-layer JSD to NoPE (``task_table``) of the attention claim's tasks (SCAN, else every analysed task),
    with the floor it is read against; a line saying why when there is none."""
    index = attention_index(grids)
    parts = ["### NoPE's attention against each PE's, per layer\n\nMin-head Jensen–Shannon divergence to the NoPE "
             "model of the same seed (nats, <= ln 2 = 0.693), mean over the analysed lengths (ID and OOD); each entry "
             "the mean over seeds [95 % Student t across seeds]. The floor: NoPE of a seed against NoPE of the grid's "
             "previous seed on the same inputs (seed vs its partner); a PE shares its seed's initial weights and "
             "batch order with that seed's NoPE, two NoPE seeds do not, so a PE can lie below it."]
    try:
        tasks, left_out = claim_tasks(T5_CLOSEST, index)
    except NotMeasured as missing:
        return "\n\n".join([*parts, f"not measured: {missing}"])
    parts += [f"{task.upper()}, the paper's task, was not analysed: every analysed task instead." for task, _ in left_out]
    for task in tasks:
        try:
            parts.append(task_table(task, index[task]))
        except NotMeasured as missing:
            parts.append(f"#### {task}\n\nnot measured: {missing}")
    return "\n\n".join(parts)
