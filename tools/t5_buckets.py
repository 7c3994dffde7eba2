"""Which T5 relative-position buckets each synthetic task trains, and which only its test split reaches.

T5's bias (Raffel et al. 2020; paper 002 runs it decoder-only, one table shared by all layers) gives every
distance i - j a bucket: distances below num_buckets / 2 their own, larger ones log-spaced up to max_distance,
everything beyond in the last bucket. A bucket no training distance falls into keeps its initial bias, so the
test split's longer distances are scored by untrained parameters. This prints, per task (its default lengths, the
format given), the longest training and test sequence in positions, the buckets each reaches, and the buckets only
the test split reaches:

    python tools/t5_buckets.py                          # every task, no scratchpad, 32 buckets, max distance 128
    python tools/t5_buckets.py --tasks copy scan --buckets 32 --max-distance 128 --scratchpad none
"""

from __future__ import annotations

import argparse

import torch

from nope_lightning.config.synthetic import sequence_tokens
from nope_lightning.model.attention import t5_buckets
from nope_lightning.synthetic.tasks import TASKS, get_task, make_split


def reach(task: str, split: str, scratchpad: str, n: int, buckets: int, max_distance: int) -> tuple[int, int]:
    """(positions of the longest of ``n`` examples of ``split``, the bucket of its longest distance)."""
    longest = max(sequence_tokens(e) for e in make_split(task, split, n=n, seed=0, scratchpad=scratchpad))
    return longest, int(t5_buckets(torch.tensor([longest - 1]), buckets, max_distance))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), help="tasks (default: all)")
    parser.add_argument("--scratchpad", default="none", help="the format (tasks without one are skipped)")
    parser.add_argument("--buckets", type=int, default=32, help="model.t5_num_buckets")
    parser.add_argument("--max-distance", type=int, default=128, help="model.t5_max_distance")
    parser.add_argument("--n", type=int, default=500, help="examples drawn per split")
    args = parser.parse_args()
    print("| task | train positions | train buckets | test positions | test buckets | only the test reaches |")
    print("|---|---|---|---|---|---|")
    for task in args.tasks:
        try:
            get_task(task).check_scratchpad(args.scratchpad)
        except ValueError:
            continue
        train, train_bucket = reach(task, "train", args.scratchpad, args.n, args.buckets, args.max_distance)
        test, test_bucket = reach(task, "test", args.scratchpad, args.n, args.buckets, args.max_distance)
        untrained = f"{train_bucket + 1}-{test_bucket}" if test_bucket > train_bucket else "none"
        print(f"| {task} | {train} | 0-{train_bucket} | {test} | 0-{test_bucket} | {untrained} |")


if __name__ == "__main__":
    main()
