"""Evaluation cost, measured side by side in one run (performance claims live here, not in tests).

1. Peak memory of the attention-entropy computation at T, 2T, 4T, 8T: ours (``attention_entropy_from_qk``,
   query chunks) vs a naive full T x T softmax. Each measurement runs in a fresh process and reports the
   growth of its peak resident memory over the inputs (glibc is told to return large blocks to the OS, so
   one measurement does not inherit another's heap).
2. Evaluation throughput of the small model: tokens/s of a plain scoring forward and of a forward with the
   entropy probe attached, at each length.
3. Generation time of the small model (``train_len`` 256) at 8x ``train_len``: passkey-style (a 2048-token
   prompt, 10 new tokens) and long-context-style (64 new tokens) greedy decoding, with the KV cache vs full
   forwards per token, interleaved best-of repeats, and the ratio. Both decoders give the same tokens
   (asserted here; the tests prove it for every position encoding).
4. ``--only compile``: the small model's scoring forward (what sliding-window perplexity runs) eager vs
   ``torch.compile(dynamic=False)`` at 2x, 4x, 8x of ``train_len`` 128, interleaved repeats, and each length's
   compile time. ``dynamic=False`` because evaluation runs a handful of fixed window shapes (one graph each,
   specialised), where dynamic shapes would give up shape-specialised kernels for no saved recompiles.

Usage: ``python tools/benchmark_evaluate.py [--base 1024] [--heads 4] [--head-size 32] [--chunk 256]
[--only generation|compile]``.
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
    from nope_lightning.numerics.metrics import attention_entropy_from_qk

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
    from nope_lightning.model import GPT
    from nope_lightning.model.probes import attention_probe
    from nope_lightning.numerics.metrics import AttentionEntropy, attention_entropy_from_qk

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


def generation_times(pe: str, prompt_len: int, new_tokens: int, batch: int,
                     repeats: int = 2) -> tuple[float, float]:
    """Seconds (best of ``repeats``) to greedily decode ``new_tokens`` after ``batch`` random prompts of
    ``prompt_len`` tokens with the small model (position encoding ``pe``): (cached, full forwards)."""
    from nope_lightning.config import ModelConfig
    from nope_lightning.eval.generate import greedy_decode
    from nope_lightning.model import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(pos_encoding=pe), 2048, 256).eval()
    prompts = torch.randint(0, 2048, (batch, prompt_len)).tolist()
    best = {True: float("inf"), False: float("inf")}
    outputs = {}
    for _ in range(repeats):
        for cached in (True, False):
            start = time.perf_counter()
            outputs[cached] = greedy_decode(model, prompts, new_tokens, vocab_size=2048, use_cache=cached)
            best[cached] = min(best[cached], time.perf_counter() - start)
    assert outputs[True] == outputs[False], "cached and full-forward decoding disagree"
    return best[True], best[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--only", choices=("memory", "throughput", "generation", "compile"), default=None,
                        help="run one part of the benchmark")
    args = parser.parse_args()
    if args.only in (None, "memory"):
        entropy_memory(args)
    torch.set_num_threads(os.cpu_count() or 1)
    if args.only in (None, "throughput"):
        print(f"\nsmall model (4 x 128), batch {args.batch}, {torch.get_num_threads()} threads: evaluation tokens/s")
        print(f"{'T':>6s} {'forward':>9s} {'+entropy':>9s}")
        for T in [args.base * m for m in (1, 2, 4)]:
            plain, probed = throughput(T, args.batch)
            print(f"{T:6d} {plain:9.0f} {probed:9.0f}")
    if args.only in (None, "generation"):
        prompt_len = 8 * 256
        print(f"\ngreedy generation, small model (train_len 256), prompt {prompt_len} tokens, batch {args.batch}, "
              f"{torch.get_num_threads()} threads: seconds")
        print(f"{'PE':>6s} {'new':>4s} {'cached':>8s} {'full':>8s} {'speedup':>8s}")
        for pe in ("nope", "rope", "alibi"):
            for new_tokens in (10, 64):
                cached, full = generation_times(pe, prompt_len, new_tokens, args.batch)
                print(f"{pe:>6s} {new_tokens:4d} {cached:8.2f} {full:8.2f} {full / cached:7.1f}x")
    if args.only == "compile":
        compile_comparison(args.batch)


def compile_comparison(batch: int, repeats: int = 5) -> None:
    """Part 4: scoring forward, eager vs compiled, medians of interleaved repeats (process CPU time and wall)."""
    import statistics

    from nope_lightning.config import ModelConfig
    from nope_lightning.model import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(), 2048, 128).eval()
    compiled = torch.compile(model, dynamic=False)
    print(f"\nscoring forward, small model (4 x 128, train_len 128), batch {batch}, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}: eager vs torch.compile, medians of {repeats} interleaved repeats")
    print(f"{'T':>6s} {'compile s':>10s} {'eager tok/s':>12s} {'compiled':>9s} {'ratio cpu':>10s} {'ratio wall':>11s}")
    for T in (256, 512, 1024):
        idx = torch.randint(0, 2048, (batch, T))
        with torch.no_grad():
            start = time.perf_counter()
            compiled(idx)
            compile_s = time.perf_counter() - start
            assert torch.allclose(compiled(idx), model(idx), atol=1e-4), "compiled forward disagrees"
            times = {False: [], True: []}
            for _ in range(repeats):
                for use in (False, True):
                    wall, cpu = time.perf_counter(), time.process_time()
                    (compiled if use else model)(idx)
                    times[use].append((time.perf_counter() - wall, time.process_time() - cpu))
        med = {use: (statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts))
               for use, ts in times.items()}
        print(f"{T:6d} {compile_s:10.1f} {batch * T / med[False][0]:12.0f} {batch * T / med[True][0]:9.0f} "
              f"{med[False][1] / med[True][1]:9.2f}x {med[False][0] / med[True][0]:10.2f}x")


def entropy_memory(args: argparse.Namespace) -> None:
    """Part 1: the peak-memory table."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # inherited by the spawned children
    lengths = [args.base * m for m in (1, 2, 4, 8)]
    print(f"attention entropy, peak memory growth (MiB), H={args.heads}, d={args.head_size}, chunk={args.chunk}")
    print(f"{'T':>6s} {'chunked':>9s} {'naive':>9s} {'naive/chunked':>14s}")
    for T in lengths:
        chunked = peak_memory("chunked", T, args.heads, args.head_size, args.chunk)
        naive = peak_memory("naive", T, args.heads, args.head_size, args.chunk)
        print(f"{T:6d} {chunked:9.1f} {naive:9.1f} {naive / max(chunked, 1e-9):14.1f}")


if __name__ == "__main__":
    main()
