"""Analysis of the synthetic grid: PE ranking, attention similarity to NoPE, attended distance (its tables and
plots: ``grid_plots.py``).

* ``mrr_with_ties`` — mean reciprocal rank of the PEs over queries ((task, seed) pairs), tied scores
  sharing their average rank; ``mrr_row_order`` — the same with ties broken as the reference breaks them
  (pandas' ``rank(method="first")``: the method listed first wins), which favours whichever PE comes first.
* ``jsd`` / ``min_head_jsd`` — the textbook Jensen–Shannon divergence in nats (natural log, so
  0 <= JSD <= ln 2) between attention rows; per layer, the minimum over *all* head pairs (PE head i,
  NoPE head j) of the mean over query rows. The reference computes KL in the reverse direction and only
  over pairs i < j; we fix both, as the anchor note recommends.
* ``attended_distances`` / ``attended_distance_hist`` — the reference's normalised attended distance
  ``(i - argmax_j a[i, j]) / (i + 1)`` for 0-based query i (divided by the i + 1 keys it can see), in
  [0, 1): 0 is the query itself, values near 1 the start of the sequence.
* ``floor_partner`` / ``analyse_attention(floor=...)`` — the NoPE-vs-NoPE floor: the same JSD between the NoPE
  models of two seeds on one seed's inputs, against which "PE X's attention is close to NoPE's" is read. A PE's
  model shares its seed's initial weights and batch order with that seed's NoPE (``stages.synthetic.build_model``);
  two NoPE seeds share neither, so a PE can sit below the floor through its seed alone: the floor scales
  "close", it is no noise floor that a PE's JSD must exceed.

Attention maps come from a teacher-forced forward over the whole ``<bos> prompt <sep> target <eos>``
sequence (as the reference's analyzers), one example at a time, so no padding enters a row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from nope_lightning.model.gpt import GPT
from nope_lightning.model.probes import attention_logits, attention_probe
from nope_lightning.results.synthetic import TaskAttention
from nope_lightning.synthetic.core import Example
from nope_lightning.synthetic.vocab import Vocabulary

# --- ranking ----------------------------------------------------------------------------------------


def _reciprocal_ranks(scores: Mapping[str, Sequence[float]], ties: str) -> dict[str, float]:
    """Each method's mean over queries of 1 / its rank (1 = highest score); ``ties``: "average" or "first"."""
    names = list(scores)
    table = np.asarray([scores[name] for name in names], dtype=float)  # (methods, queries)
    if table.ndim != 2 or table.shape[1] == 0:
        raise ValueError("every method needs one score per query, and at least one query")
    if np.isnan(table).any():
        raise ValueError("scores contain NaN")
    if ties == "average":
        return dict(zip(names, reciprocal_ranks(table.T).mean(0).tolist(), strict=True))
    # "first": the tied methods listed before i ([i, j]: j < i) rank above it; [i, j, q]: method j against i on q
    higher, tied = (table[None] > table[:, None]).sum(1), table[None] == table[:, None]
    rank = higher + (tied & np.tri(len(names), k=-1, dtype=bool)[:, :, None]).sum(axis=1) + 1
    return {name: float(np.mean(1.0 / rank[i])) for i, name in enumerate(names)}


def reciprocal_ranks(scores: np.ndarray) -> np.ndarray:
    """1 / rank of each method, ``scores`` (..., methods) -> the same shape, over any leading axes (queries,
    resamples): rank 1 the highest score, tied methods sharing their ranks' mean (two tied first: 1 / 1.5 each)."""
    higher = (scores[..., None, :] > scores[..., :, None]).sum(-1)  # [..., i]: methods scoring above method i
    tied = (scores[..., None, :] == scores[..., :, None]).sum(-1)  # including method i itself
    return 1.0 / (higher + (tied + 1) / 2)


def mrr_with_ties(scores: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Mean reciprocal rank of each method; ``scores[method][q]`` is its score on query q (higher wins). On each
    query tied methods all get the mean of the ranks they span (pandas' ``rank(method="average")``,
    ``reciprocal_ranks``); a method's MRR is the mean over queries of 1/rank."""
    return _reciprocal_ranks(scores, "average")


def mrr_row_order(scores: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``mrr_with_ties`` with ties broken by the order of ``scores``' keys, as the reference computes paper 002's
    MRR (pandas' ``rank(method="first", ascending=False)`` down a frame whose rows are the PEs): of two tied
    methods the one listed first gets the better rank, so the ranks of a query are always 1..n."""
    return _reciprocal_ranks(scores, "first")


#: The reference's row order when it ranks paper 002's MRR (``notebooks/plot_aggregate_final.ipynb`` of
#: McGill-NLP/length-generalization): a tie goes to the PE listed first, so NoPE, listed last, loses every tie.
PAPER_ROW_ORDER = ("rope", "alibi", "t5", "sinusoidal", "nope")


@dataclass(frozen=True)
class PaperMRR:
    """Paper 002's MRR computed as the paper does over the queries given: ``mrr[pe]`` over all of them,
    ``per_seed[pe]`` over each seed's (``seeds`` order); ``tasks``: the tasks ranked, ``queries``: how many (task,
    seed) pairs; ``missing``: the paper's tasks without a query here. The paper ranks all its 17 tasks: with one
    missing, these are MRRs over fewer tasks, not comparable with its numbers (``comparable``)."""

    mrr: dict[str, float]
    per_seed: dict[str, tuple[float, ...]]
    seeds: tuple[int, ...]
    tasks: tuple[str, ...]
    queries: int
    missing: tuple[str, ...]

    @property
    def comparable(self) -> bool:
        return not self.missing


def paper_mrr(scores: Mapping[tuple[str, int], Mapping[str, float]], paper_tasks: Sequence[str]) -> PaperMRR:
    """MRR as paper 002 computes it: ``scores[(task, seed)][pe]`` is a PE's test exact match on a query; every
    query is ranked, with no in-distribution filter (a PE that never learned a task still takes a rank there),
    ties broken by ``PAPER_ROW_ORDER`` (``mrr_row_order``). The PEs ranked are those of ``PAPER_ROW_ORDER`` that
    ``scores`` holds; ``ValueError`` when a query lacks one of them (the reference drops such a query, silently).
    ``paper_tasks``: the tasks the paper ranks, to name those missing here."""
    pes = [pe for pe in PAPER_ROW_ORDER if any(pe in by_pe for by_pe in scores.values())]
    if lacking := [query for query, by_pe in scores.items() if any(pe not in by_pe for pe in pes)]:
        raise ValueError(f"{len(lacking)} queries lack a PE's result, e.g. (task, seed) = {lacking[0]}")
    seeds = sorted({seed for _, seed in scores})

    def over(queries: list[tuple[str, int]]) -> dict[str, float]:
        return mrr_row_order({pe: [scores[q][pe] for q in queries] for pe in pes})

    per_seed = [over([q for q in scores if q[1] == seed]) for seed in seeds]
    tasks = tuple(dict.fromkeys(task for task, _ in scores))
    return PaperMRR(over(list(scores)), {pe: tuple(m[pe] for m in per_seed) for pe in pes}, tuple(seeds), tasks,
                    len(scores), tuple(t for t in paper_tasks if t not in tasks))


# --- attention divergence -----------------------------------------------------------------------------


def _kl(p: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    # xlogy(0, .) = 0 gives 0 log 0 = 0 on masked (future) keys without 0/0.
    return (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence in nats between distributions on the last dim (broadcasting).

    ``JSD(p, q) = KL(p || m) / 2 + KL(q || m) / 2`` with ``m = (p + q) / 2``: symmetric, 0 iff p = q,
    at most ln 2. Returns shape ``broadcast(p, q).shape[:-1]``, float32 or wider.
    """
    p, q = p.float(), q.float()
    m = (p + q) / 2
    return ((_kl(p, m) + _kl(q, m)) / 2).clamp(min=0.0)  # clamp: rounding can give -1e-8


def min_head_jsd(probs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per layer, the minimum over all head pairs of the mean over query rows of JSD (nats).

    ``probs`` (L, H, T, T) and ``reference`` (L, H', T, T) are causal attention probabilities of the
    same sequence; head i of ``probs`` is compared with every head j of ``reference``. Returns (L,).
    """
    pairs = jsd(probs[:, :, None], reference[:, None])  # (L, H, H', T)
    return pairs.mean(-1).flatten(1).min(-1).values


@torch.no_grad()
def attention_maps(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """Attention probabilities of every layer for one sequence ``ids`` (T,): (L, H, T, T) float32, on CPU."""
    maps: list[torch.Tensor] = []

    def keep(layer: int, q_scaled: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> None:
        maps.append(attention_logits(q_scaled, k, mask).softmax(-1)[0].cpu())

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with attention_probe(model, keep):
        model(ids[None].to(device))
    model.train(was_training)
    return torch.stack(maps)


# --- attended distance -------------------------------------------------------------------------------


def attended_distances(probs: torch.Tensor, query_start: int, query_end: int | None = None) -> torch.Tensor:
    """Normalised attended distance ``(i - argmax_j a[i, j]) / (i + 1)`` of query rows i in
    [query_start, query_end), for every leading index (layer, head): a flat float tensor in [0, 1).

    ``probs`` (..., T, T) are causal attention probabilities (or logits: only the argmax matters).
    """
    T = probs.size(-1)
    rows = torch.arange(query_start, T if query_end is None else query_end)
    attended = probs[..., rows, :].argmax(-1)  # (..., Q)
    return ((rows - attended) / (rows + 1)).flatten().float()


def attended_distance_hist(probs: torch.Tensor, query_start: int, query_end: int | None = None,
                           bins: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Counts (bins,) and edges (bins + 1,) over [0, 1] of ``attended_distances``."""
    distances = attended_distances(probs, query_start, query_end).numpy()
    return np.histogram(distances, bins=bins, range=(0.0, 1.0))


# --- one (task, seed): every PE against NoPE ---------------------------------------------------------


class AnalysisSequence(NamedTuple):
    """A teacher-forced sequence: its task length, ids (T,), first output query and whether it is OOD.

    ``query_start`` is the ``<sep>`` position: queries from there to T-2 predict the target tokens.
    """

    length: int
    ids: torch.Tensor
    query_start: int
    ood: bool


def analysis_sequences(vocab: Vocabulary, examples: Sequence[Example], per_length: int,
                       train_max: int) -> list[AnalysisSequence]:
    """The first ``per_length`` of ``examples`` (valid then test: ID, then OOD) of every length, by length."""
    taken: dict[int, int] = defaultdict(int)
    sequences = []
    for example in examples:
        if taken[example.length] < per_length:
            taken[example.length] += 1
            ids, _ = vocab.encode(example)
            sequences.append(AnalysisSequence(example.length, torch.tensor(ids), len(vocab.encode_prompt(example)) - 1,
                                              example.length > train_max))
    return sorted(sequences, key=lambda s: s.length)


@dataclass
class AttentionReport:
    """``jsd[pe][length]``: layer-mean min-head JSD to the reference, averaged over examples of that
    length; ``jsd_layers[pe][length]``: the same per layer (paper 002's Fig 4 shows layers apart: the first
    layers, which read positions, differ most between encodings); ``hist[pe]``: attended-distance counts over
    OOD examples' output queries; ``edges``: bins. ``floor_layers[length]``: per layer, the same JSD between the
    reference model and the reference PE's model of another seed, ``floor_seed`` (``floor_partner``), on the same
    sequences; empty (and ``floor_seed`` None) without one."""

    jsd: dict[str, dict[int, float]] = field(default_factory=dict)
    jsd_layers: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    hist: dict[str, np.ndarray] = field(default_factory=dict)
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0))
    floor_layers: dict[int, list[float]] = field(default_factory=dict)
    floor_seed: int | None = None

    def stored(self, seed: int) -> TaskAttention:
        """The report of seed ``seed`` as stored (``SeedAttention``); ``from_stored`` reads it back."""
        partners = {} if self.floor_seed is None else {seed: self.floor_seed}
        return TaskAttention(self.jsd, self.jsd_layers, {pe: c.tolist() for pe, c in self.hist.items()},
                             self.edges.tolist(), self.floor_layers, partners)

    @classmethod
    def from_stored(cls, a: TaskAttention, seed: int) -> AttentionReport:
        return cls(a.jsd, a.jsd_by_layer, {pe: np.asarray(h) for pe, h in a.hist.items()}, np.asarray(a.edges),
                   a.floor_by_layer, a.floor_partners.get(seed))


def floor_partner(seeds: Sequence[int], seed: int) -> int | None:
    """The seed whose NoPE model is compared with ``seed``'s for its NoPE-vs-NoPE floor: the one before it in the
    grid's ``seeds``; None for the first. Each (task, seed) is analysed as soon as its models are trained, on its own
    inputs, with only the previous seed's NoPE kept for it: the floor is stored once with the rest of that seed's
    analysis and a resumed grid needs no other model. n seeds give n - 1 floors, each pair of neighbours once
    (closing the cycle, the first seed against the last, would give n, but with 2 seeds one pair twice and with more
    each NoPE model in two floors, which a t interval across seeds would count as independent)."""
    index = list(seeds).index(seed)
    return seeds[index - 1] if index else None


def analyse_attention(models: Mapping[str, GPT], sequences: Sequence[AnalysisSequence], reference: str = "nope",
                      bins: int = 20, floor: tuple[int, GPT] | None = None) -> AttentionReport:
    """JSD of every model's attention to ``models[reference]`` vs length, and attended-distance histograms; with
    ``floor`` (a seed, and the reference PE's model of that seed) also that model's JSD to the reference."""
    jsd_values: dict[str, dict[int, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    report = AttentionReport(edges=np.linspace(0.0, 1.0, bins + 1), floor_seed=None if floor is None else floor[0])
    report.hist = {name: np.zeros(bins, dtype=np.int64) for name in models}
    floor_values: dict[int, list[np.ndarray]] = defaultdict(list)
    for seq in sequences:
        ref = attention_maps(models[reference], seq.ids)
        if floor is not None:
            floor_values[seq.length].append(min_head_jsd(attention_maps(floor[1], seq.ids), ref).numpy())
        for name, model in models.items():
            maps = ref if name == reference else attention_maps(model, seq.ids)
            if name != reference:
                jsd_values[name][seq.length].append(min_head_jsd(maps, ref).numpy())  # (n_layer,)
            if seq.ood:
                report.hist[name] += attended_distance_hist(maps, seq.query_start, len(seq.ids) - 1, bins)[0]
    report.jsd_layers = {name: _per_length(per_length) for name, per_length in jsd_values.items()}
    report.jsd = {name: {length: float(np.mean(v)) for length, v in per_length.items()}
                  for name, per_length in report.jsd_layers.items()}
    report.floor_layers = _per_length(floor_values)
    return report


def _per_length(values: Mapping[int, Sequence[np.ndarray]]) -> dict[int, list[float]]:
    """Per length (ascending), the mean over its examples of their (n_layer,) values."""
    return {length: np.mean(v, axis=0).tolist() for length, v in sorted(values.items())}


def _length_mean(per_length: Mapping[int, Sequence[float]]) -> list[float]:
    """The mean over lengths (each weighing the same) of per-layer values: (n_layer,)."""
    return np.mean(list(per_length.values()), axis=0).tolist()


def task_attention(reports: Mapping[int, AttentionReport], names: Mapping[str, str]) -> TaskAttention:
    """One task's analysis over its seeds (``reports[seed]``, every seed's of the same lengths; PEs renamed by
    ``names``): JSD per length and per layer, mean over seeds; histograms summed; the floor per length and layer,
    mean over the seeds that have one; and each seed's per-layer JSD and floor, mean over the analysed lengths (ID
    and OOD, each length weighing the same, as paper 002's Fig 4 pools SCAN's instances)."""
    cells, first = list(reports.values()), next(iter(reports.values()))
    floors = [c.floor_layers for c in cells if c.floor_layers]
    return TaskAttention(
        {names.get(pe, pe): {length: float(np.mean([c.jsd[pe][length] for c in cells])) for length in first.jsd[pe]}
         for pe in first.jsd},
        {names.get(pe, pe): {length: np.mean([c.jsd_layers[pe][length] for c in cells], axis=0).tolist()
                             for length in first.jsd_layers[pe]} for pe in first.jsd_layers},
        {names.get(pe, pe): sum(c.hist[pe] for c in cells).tolist() for pe in first.hist}, first.edges.tolist(),
        {length: np.mean([f[length] for f in floors], axis=0).tolist() for length in floors[0]} if floors else {},
        {seed: c.floor_seed for seed, c in reports.items() if c.floor_seed is not None},
        {seed: {names.get(pe, pe): _length_mean(v) for pe, v in c.jsd_layers.items()} for seed, c in reports.items()},
        {seed: _length_mean(c.floor_layers) for seed, c in reports.items() if c.floor_layers})


# --- lengths ---------------------------------------------------------------------------------------


def bucket_start(label: str) -> int:
    """The first length of a bucket label (``"24"`` -> 24, ``"21-25"`` -> 21)."""
    return int(label.split("-")[0])
