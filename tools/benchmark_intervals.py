"""How much evaluation data makes an interval useful: the 95 % bootstrap half-width of log-PPL (and of the paired
2x - 1x difference) against the number of scored target tokens, for two strides, on one trained model.

    python tools/benchmark_intervals.py --checkpoint <export folder> [--windows 2048] [--strides 16 64]

Scores ``--windows`` windows per stride at 1x, 2x, 4x, 8x the model's train_len on the test split, with the
evaluate stage's own windows (every length ends on the same target tokens, ``eval.perplexity.target_ends``),
then bootstraps evenly spaced subsets of 1/8, 1/4, 1/2 and all of them, with evaluate's blocks of windows
(``numerics.stats.block_size``). Prints one JSON line per (stride, subset): scored tokens, tokens of forward pass
per length (the cost), and the half-widths in nats.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from nope_lightning.config import TrackingConfig
from nope_lightning.data import TextTokenizer
from nope_lightning.eval.perplexity import scoring_windows, split_documents_of, spread, target_ends
from nope_lightning.model.checkpoint import load_model
from nope_lightning.numerics.stats import block_size, blocks, bootstrap


@torch.no_grad()
def window_nll(model, docs: list[np.ndarray], windows, length: int, batch: int = 16) -> np.ndarray:
    """Each window's NLL sum over its scored targets (nats)."""
    out = []
    for start in range(0, len(windows), batch):
        chunk = windows[start:start + batch]
        tokens = torch.stack([torch.as_tensor(docs[w.doc][w.start:w.start + length + 1]) for w in chunk])
        logits = model(tokens[:, :-1])[:, chunk[0].score_from:].float()
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, chunk[0].score_from + 1:].flatten(),
                                                reduction="none")
        out += nll.view(len(chunk), -1).sum(1).tolist()
    return np.asarray(out)


def half_width(rows: np.ndarray, docs: np.ndarray) -> float:
    units = blocks(rows, docs, block_size(len(rows)))
    return bootstrap([units], lambda s: s[:, 0, 0] / s[:, 0, 1], 1000).half_width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--windows", type=int, default=2048)
    parser.add_argument("--strides", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    loaded = load_model(args.checkpoint, TrackingConfig())
    model, L = loaded.model.eval(), loaded.config.train_len
    tokenizer = TextTokenizer.load(loaded.tokenizer_file)
    docs = [ids for _, ids in split_documents_of(loaded, loaded.config.data.corpus, tokenizer, "test")]
    lengths = [L, 2 * L, 4 * L, 8 * L]
    for stride in args.strides:
        ends = target_ends([len(d) for d in docs], max(lengths), stride, args.windows * stride)
        nll = {n: window_nll(model, docs, scoring_windows(ends, n, stride), n) for n in lengths}
        for fraction in (8, 4, 2, 1):
            pick = spread(len(ends) // fraction, len(ends))
            doc = np.asarray([ends[i][0] for i in pick])
            count = np.full(len(pick), float(stride))
            row = {"stride": stride, "windows": len(pick), "scored_tokens": len(pick) * stride,
                   "forward_tokens_per_length": {n: len(pick) * n for n in lengths}}
            row.update({f"half_width_{n // L}x": half_width(np.stack([nll[n][pick], count], 1), doc) for n in lengths})
            row["half_width_paired_2x_minus_1x"] = half_width(np.stack([nll[2 * L][pick] - nll[L][pick], count], 1), doc)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
