"""Evaluation cost, measured side by side in one run (performance claims live here, not in tests).

1. Peak memory of the attention-entropy computation at T, 2T, 4T, 8T: ours (``attention_entropy_from_qk``,
   query chunks) vs a naive full T x T softmax. Each measurement runs in a fresh process and reports the
   growth of its peak resident memory over the inputs (glibc is told to return large blocks to the OS, so
   one measurement does not inherit another's heap).
2. Evaluation throughput of the small model: tokens/s of a plain scoring forward and of a forward with the
   entropy probe attached, at each length.

Usage: ``python experiments/benchmark_evaluate.py [--base 1024] [--heads 4] [--head-size 32] [--chunk 256]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import time

import torch


def _peak_growth(kind: str, T: int, heads: int, head_size: int, chunk: int, queue) -> None:
    """In a child process: peak RSS growth (MiB) of one entropy computation over (1, H, T, d) inputs."""
    torch.set_num_threads(1)
    from nope_lightning.metrics import attention_entropy_from_qk

    q, k = torch.randn(1, heads, T, head_size), torch.randn(1, heads, T, head_size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.no_grad():
        if kind == "chunked":
            attention_entropy_from_qk(q, k, head_size**-0.5, chunk)
        else:
            logits = (q @ k.transpose(-1, -2)) * head_size**-0.5
            logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            torch.special.entr(logits.softmax(-1)).sum(-1)
    queue.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)


def peak_memory(kind: str, T: int, heads: int, head_size: int, chunk: int) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_peak_growth, args=(kind, T, heads, head_size, chunk, queue))
    proc.start()
    value = queue.get()
    proc.join()
    return value


def throughput(T: int, batch: int, repeats: int = 3) -> tuple[float, float]:
    """tokens/s of the small model's scoring forward, without and with the entropy probe (best of repeats)."""
    from nope_lightning.config import ModelConfig
    from nope_lightning.metrics import AttentionEntropy, attention_entropy_from_qk
    from nope_lightning.model import GPT
    from nope_lightning.model.probes import attention_probe

    cfg = ModelConfig()
    model = GPT(cfg, 2048, 256).eval()
    idx = torch.randint(0, 2048, (batch, T))
    metric = AttentionEntropy(cfg.n_layer, cfg.n_head, T)

    def probe(layer, q, k, mask):
        metric.update(layer, entropy=attention_entropy_from_qk(q, k, 1.0, 256))

    rates = []
    for with_probe in (False, True):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            with torch.no_grad():
                if with_probe:
                    with attention_probe(model, probe):
                        model(idx)
                else:
                    model(idx)
            best = min(best, time.perf_counter() - start)
        rates.append(batch * T / best)
    return rates[0], rates[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # inherited by the spawned children
    lengths = [args.base * m for m in (1, 2, 4, 8)]
    print(f"attention entropy, peak memory growth (MiB), H={args.heads}, d={args.head_size}, chunk={args.chunk}")
    print(f"{'T':>6s} {'chunked':>9s} {'naive':>9s} {'naive/chunked':>14s}")
    for T in lengths:
        chunked = peak_memory("chunked", T, args.heads, args.head_size, args.chunk)
        naive = peak_memory("naive", T, args.heads, args.head_size, args.chunk)
        print(f"{T:6d} {chunked:9.1f} {naive:9.1f} {naive / max(chunked, 1e-9):14.1f}")
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"\nsmall model (4 x 128), batch {args.batch}, {torch.get_num_threads()} threads: evaluation tokens/s")
    print(f"{'T':>6s} {'forward':>9s} {'+entropy':>9s}")
    for T in lengths[:3]:
        plain, probed = throughput(T, args.batch)
        print(f"{T:6d} {plain:9.0f} {probed:9.0f}")


if __name__ == "__main__":
    main()
