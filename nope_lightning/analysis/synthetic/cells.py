"""Paper 002's synthetic-grid cells as the claims read them (``claims``): one ``SyntheticCell`` per (task,
scratchpad, PE, seed), indexed, laid out as (seeds, tasks, columns) grids, and each cell's exact match with its Wilson
interval. Accuracies are exact match in [0, 1]: "id" in distribution (training lengths: the held-out ID test split
where a cell has one, else the validation split, ``SyntheticCell.id_score``), "ood" the test split."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nope_lightning.analysis.verdicts import NotMeasured
from nope_lightning.numerics.stats import LEVEL, Interval, wilson
from nope_lightning.results.synthetic import SyntheticCell
from nope_lightning.synthetic.scratchpad import COMPONENTS, supported_formats
from nope_lightning.synthetic.tasks import TASKS

NONE, FULL = "none", "full"  # the scratchpad formats the claims read

# --- the cells ------------------------------------------------------------------------------------------------

Column = tuple[str, str]  # (scratchpad, PE)


def exact_match(result: SyntheticCell, split: str) -> Interval:
    """One cell's exact match on ``split`` ("id": its held-out ID test examples when it has them, else its
    validation examples; "ood": its test examples) with the 95 % Wilson interval over those examples."""
    buckets = (result.id_test_buckets if split == "id" and result.id_test_buckets
               else [b for b in result.buckets if b.split == split])
    return wilson(sum(round(b.acc * b.n) for b in buckets), sum(b.n for b in buckets))


# where a task and a format sort; ones the registry does not know after those it does, by name
_TASK_RANK = {task: rank for rank, task in enumerate(TASKS)}
_FORMAT_RANK = {pad: rank for rank, pad in enumerate(supported_formats(COMPONENTS))}


def panel_rank(task: str, scratchpad: str) -> tuple:
    """Where a (task, scratchpad) sorts: the tasks without a scratchpad first, then each task's scratchpad formats
    side by side, tasks in ``TASKS`` order and formats in ``supported_formats``' order. A report reads its cells, and
    draws its panels, in this order, not in the order its runs were joined in: the crossed bootstrap resamples task
    indices, so slices joined in another order would otherwise draw other intervals (and lay out other tables)."""
    return (scratchpad != NONE, _TASK_RANK.get(task, len(_TASK_RANK)), task,
            _FORMAT_RANK.get(scratchpad, len(_FORMAT_RANK)), scratchpad)


class CellIndex:
    """The cells by (task, scratchpad, PE, seed), in ``panel_rank`` order of (task, scratchpad) and in the order
    they came within one; two cells with one key are an error."""

    def __init__(self, cells: Iterable[SyntheticCell]) -> None:
        index: dict[tuple[str, str, str, int], SyntheticCell] = {}
        for c in cells:
            key = (c.task, c.scratchpad, c.pos_encoding, c.seed)
            if key in index:
                raise ValueError(f"two results for {key} (runs {index[key].run_id} and {c.run_id})")
            index[key] = c
        self.cells = {key: index[key] for key in sorted(index, key=lambda key: panel_rank(key[0], key[1]))}

    def tasks(self, scratchpad: str) -> list[str]:
        """The tasks run with ``scratchpad``, in ``TASKS`` order (tasks it does not know last, by name)."""
        return list(dict.fromkeys(task for task, s, _, _ in self.cells if s == scratchpad))

    def plain_tasks(self, wanted: Sequence[str] = ()) -> list[str]:
        """The tasks run without a scratchpad (those of ``wanted`` when given); ``NotMeasured`` when none is."""
        if tasks := [t for t in self.tasks(NONE) if not wanted or t in wanted]:
            return tasks
        raise NotMeasured(f"the results hold none of its tasks ({', '.join(wanted)})" if wanted
                          else "no task without a scratchpad in these results")

    def seeds(self, scratchpad: str, tasks: Sequence[str]) -> list[int]:
        return sorted({seed for task, s, _, seed in self.cells if s == scratchpad and task in tasks})

    def complete(self, tasks: Sequence[str], columns: Sequence[Column]) -> tuple[list[str], list[int],
                                                                                list[tuple[str, str]]]:
        """``tasks`` split by whether each holds a cell for every column at every seed any of them ran: the complete
        ones, those seeds, and the others as (task, what it lacks). A study spanning sessions commits a task's seed
        slices one by one; its partial tasks are left out and named, not every comparison. ``NotMeasured`` (the
        missing cells) when no task is complete: a grid of two PEs is not ranked as if it were the five."""
        seeds = sorted({seed for task, pad, pe, seed in self.cells if task in tasks and (pad, pe) in columns})
        done, partial = [], []
        for task in tasks:
            lacking = [seed for seed in seeds if any((task, pad, pe, seed) not in self.cells for pad, pe in columns)]
            if not lacking:
                done.append(task)
                continue
            unrun = all((task, pad, pe, seed) not in self.cells for seed in lacking for pad, pe in columns)
            partial.append((task, f"{'not run' if unrun else 'cells missing'} at seed{'s' * (len(lacking) > 1)} "
                                  f"{', '.join(map(str, lacking))}"))
        if not done:
            self.grid(tasks, seeds, columns)  # raises NotMeasured, naming a missing cell
        return done, seeds, partial

    def grid(self, tasks: Sequence[str], seeds: Sequence[int], columns: Sequence[Column]) -> np.ndarray:
        """The cells as an object array (seeds, tasks, columns). ``NotMeasured`` when one is missing, or when the
        cells of a (task, seed) were not scored on one test split (different ``test_digest``s or test sizes)."""
        keys = [(task, pad, pe, seed) for seed in seeds for task in tasks for pad, pe in columns]
        if missing := [k for k in keys if k not in self.cells]:
            raise NotMeasured(f"{len(missing)} cells missing, e.g. (task, scratchpad, PE, seed) = {missing[0]}")
        grid = np.array([self.cells[k] for k in keys], dtype=object).reshape(len(seeds), len(tasks), len(columns))
        for s, t in np.ndindex(grid.shape[:2]):
            splits = {(c.test_digest, sum(b.n for b in c.buckets if b.split == "ood")) for c in grid[s, t]}
            if len({n for _, n in splits}) > 1 or len({d for d, _ in splits if d}) > 1:
                raise NotMeasured(f"{tasks[t]}, seed {seeds[s]}: its cells were scored on different test examples "
                                  f"(digest, size: {sorted(splits)}), so no difference between them is paired")
        return grid


def accuracy(grid: np.ndarray, split: str) -> np.ndarray:
    """Exact match of each cell of ``grid`` on ``split`` ("id" or "ood"), same shape, float."""
    return np.vectorize(lambda c: c.ood_acc if split == "ood" else c.id_score[0], otypes=[float])(grid)


def paired_bootstrap(grid: np.ndarray, pooled: Callable[[np.ndarray], np.ndarray], resamples: int,
                     seed: int = 0) -> Interval | None:
    """Evaluation-only percentile interval of ``pooled`` (accuracies (R, seeds, tasks, columns) -> (R,)): each
    (seed, task)'s test examples are drawn once for all its cells, so the cells stay paired example by example.
    None when a cell has no per-example record (a version-1 result). ``values``: the R resampled statistics
    (``robustness.quantile_se`` reads the bounds' Monte Carlo error from them).

    The draw is ``stats.bootstrap``'s (n examples with replacement per stratum), done on each (seed, task)'s
    distinct rows of 0/1 outcomes across its cells instead of its n examples: which examples are drawn matters only
    through how many of each row pattern are, and those counts are multinomial(n, the patterns' shares) exactly.
    With 5 PEs there are at most 32 patterns instead of 400 examples, which keeps 10,000 resamples cheap."""
    if any(not c.ood_correct for c in grid.flat):
        return None
    n_seeds, n_tasks, n_columns = grid.shape
    rng, sums = np.random.default_rng(seed), []
    for s, t in np.ndindex(n_seeds, n_tasks):
        rows = np.column_stack([np.asarray(c.ood_correct, dtype=float) for c in grid[s, t]])
        patterns, counts = np.unique(rows, axis=0, return_counts=True)
        sums.append(rng.multinomial(len(rows), counts / len(rows), size=resamples) @ patterns / len(rows))
    values = np.asarray(pooled(np.stack(sums, 1).reshape(resamples, n_seeds, n_tasks, n_columns)), dtype=float)
    full = accuracy(grid, "ood")[None]
    return percentile_interval(float(np.asarray(pooled(full)).reshape(-1)[0]), values)


def percentile_interval(estimate: float, values: np.ndarray, level: float = LEVEL) -> Interval:
    """``stats.bootstrap``'s percentile interval of resampled ``values`` (R,) around ``estimate``: undefined
    (non-finite) resamples left out and counted; the values kept on the interval's ``values``."""
    finite = values[np.isfinite(values)]
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2]) if finite.size else (np.nan, np.nan)
    return BootInterval(estimate, float(low), float(high), level, undefined=int(values.size - finite.size),
                        resamples=int(values.size), values=finite)


@dataclass(frozen=True)
class BootInterval(Interval):
    """A bootstrap ``Interval`` that keeps its resampled statistics (``values``, the finite ones), from which
    the Monte Carlo error of its bounds is read (``robustness.quantile_se``)."""

    values: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)
