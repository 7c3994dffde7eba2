"""The papers' published numbers that the report prints beside ours (never used in any computation).

Paper 001 (Wang, Ji et al. 2024), TinyLlama-1.1B at L = 2K. Table 2: sliding-window PPL (S = 256) on PG19
and Proof-pile at 2K/4K/8K/16K, i.e. 1x/2x/4x/8x the training length — the columns we compare with our
1x/2x/4x/8x ``train_len``. ``inf`` stands for the paper's "> 10^3". Keys are our pipeline labels.
"""

from __future__ import annotations

INF = float("inf")
MULTIPLES = (1, 2, 4, 8)

TABLE2_PG19: dict[str, tuple[float, float, float, float]] = {
    "rope": (14.5, 491.4, 488.5, 599.5),
    "nope": (14.6, 326.9, INF, INF),
    "rope+ntk": (14.5, 14.9, 22.8, 80.4),
    "rope+yarn": (14.5, 14.5, 15.0, 17.1),
    "nope lambda=1.2": (15.0, 16.0, 513.7, INF),
    "nope lambda=1.5": (19.0, 20.2, 45.3, 224.1),
    "nope lambda=1.8": (30.4, 42.4, 69.1, 198.8),
    "pi fair 2x": (16.0, 15.9, 551.9, INF),
    "yarn fair 2x": (15.5, 15.4, 545.2, INF),
    "pi raw 2x": (15.2, 15.0, 623.8, 951.7),
    "yarn raw 2x": (15.1, 15.0, 573.3, 951.4),
    "pi fair 4x": (17.4, 17.1, 17.1, 752.8),
    "yarn fair 4x": (15.7, 15.4, 15.5, 794.6),
    "headscale 2x": (14.8, 15.3, 404.5, INF),
    "headscale 4x": (15.7, 15.3, 21.1, 721.7),
}

TABLE2_PROOFPILE: dict[str, tuple[float, float, float, float]] = {
    "rope": (3.5, 303.0, 432.1, 759.5),
    "nope": (3.5, 117.4, INF, INF),
    "rope+ntk": (3.5, 3.3, 4.1, 13.3),
    "rope+yarn": (3.5, 3.3, 3.2, 3.6),
    "nope lambda=1.2": (3.6, 3.3, 175.3, INF),
    "nope lambda=1.5": (3.9, 3.7, 4.9, 99.2),
    "nope lambda=1.8": (5.1, 5.6, 8.5, 38.2),
    "headscale 2x": (3.5, 3.2, 153.4, INF),
    "headscale 4x": (3.6, 3.3, 3.2, 318.5),
}

#: Table 4 (HeadScale at 18K): PPL@16K on PG19 / Proof-pile, passkey accuracy (%), LongBench average.
TABLE4 = {
    "headscale": {"pg19": 30.4, "proofpile": 4.1, "passkey": 81, "longbench": 17.0},
    "headscale w/o constraint": {"pg19": 25.9, "proofpile": 4.2, "passkey": 53, "longbench": 16.7},
    "headscale w/o init": {"pg19": 31.4, "proofpile": 4.3, "passkey": 26, "longbench": 15.8},
}

#: Paper 002 (Kazemnejad et al. 2023): mean reciprocal rank of each PE across tasks and seeds.
SYNTHETIC_MRR = {"nope": 0.69, "t5": 0.55, "alibi": 0.50, "rope": 0.33, "learned": 0.22}


def fmt(value: float) -> str:
    """A PPL as the paper prints it (``>1e3`` above a thousand)."""
    return ">1e3" if value > 1000 else f"{value:.1f}"
