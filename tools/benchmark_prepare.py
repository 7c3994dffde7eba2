"""Preparing a pretraining corpus: ``data.engine=memory`` vs ``data.engine=litdata``, side by side in one run.

For each corpus size in ``--mb`` it writes a corpus of .jsonl files (the 66 KJV books of the built-in ``kjv``
corpus, one file per copy, each book headed by its copy's number: documents with varied names), then runs
``prepare`` once per engine, each in a fresh child process from an empty cache, with the same
``data.tokenizer`` (a BPE trained here once on the KJV), so both time listing, splitting, tokenizing and
writing rather than tokenizer training. Printed per run: wall seconds, tokens/s (every split's tokens /
wall), the CPU seconds of the child's process tree (user + system, ``RUSAGE_CHILDREN``: what other jobs on
a shared machine cannot inflate, imports included), and the peak memory of that tree: the proportional set
size (PSS: each shared page split between the processes that map it, so torch's libraries count once, not once
per litdata worker) of the prepare process plus its worker processes, summed (psutil, sampled every 20 ms);
then the litdata / memory ratios.

Usage: ``python tools/benchmark_prepare.py [--mb 16 32] [--workers 0] [--vocab 2048]``. ``--workers`` is
``data.num_workers`` (0: one per core).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from nope_lightning.config import DataConfig
from nope_lightning.data import TextTokenizer, prepare
from nope_lightning.data.corpus import kjv_books

ENGINES = ("memory", "litdata")


def write_corpus(folder: Path, megabytes: float) -> int:
    """KJV copies as ``copy<k>.jsonl`` files under ``folder`` until ``megabytes`` MB; returns the bytes."""
    books = kjv_books()
    size = sum(len(b.text.encode()) for b in books)
    folder.mkdir(parents=True)
    for copy in range(math.ceil(megabytes * 1e6 / size)):
        lines = (json.dumps({"text": f"Copy {copy}: {b.text}"}) + "\n" for b in books)
        (folder / f"copy{copy:03d}.jsonl").write_text("".join(lines))
    return sum(p.stat().st_size for p in folder.iterdir())


def child(engine: str, corpus: str, tokenizer: str, cache: str, workers: int) -> None:
    """One prepare from an empty cache; prints ``{"seconds", "tokens"}`` as the last line."""
    start = time.perf_counter()
    prepared = prepare(DataConfig(corpus=corpus, tokenizer=tokenizer, cache_dir=cache, engine=engine,
                                  num_workers=workers))
    seconds = time.perf_counter() - start
    tokens = sum(split["tokens"] for split in prepared.manifest["splits"].values())
    print(json.dumps({"seconds": seconds, "tokens": tokens}))


def measured(engine: str, corpus: Path, tokenizer: Path, workers: int) -> dict[str, float]:
    """Run ``child`` in a fresh process with an empty cache, sampling its process tree's memory (PSS)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TQDM_DISABLE": "1"}
        command = [sys.executable, __file__, "--child", engine, str(corpus), str(tokenizer), cache,
                   str(workers)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, text=True)
        peak, tree = 0, psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                pss = sum(p.memory_full_info().pss for p in [tree, *tree.children(recursive=True)])
            except psutil.Error:  # a worker ended between listing and reading it
                continue
            peak = max(peak, pss)
            time.sleep(0.02)
        out = proc.stdout.read()
        if proc.returncode:
            raise RuntimeError(f"{engine} prepare failed (exit {proc.returncode})")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "tokens_per_s": result["tokens"] / result["seconds"], "cpu_s": cpu,
            "peak_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[16.0, 32.0], help="corpus sizes in MB")
    parser.add_argument("--workers", type=int, default=0, help="data.num_workers (0: one per core)")
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--child", nargs=5, metavar=("ENGINE", "CORPUS", "TOKENIZER", "CACHE", "WORKERS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, corpus, tokenizer, cache, workers = args.child
        child(engine, corpus, tokenizer, cache, int(workers))
        return
    with tempfile.TemporaryDirectory() as work:
        tokenizer = Path(work) / "tokenizer.json"
        TextTokenizer.train((b.text for b in kjv_books()), args.vocab).save(tokenizer)
        print(f"{os.cpu_count()} cores, data.num_workers={args.workers}, vocab {args.vocab}")
        print(f"{'corpus':>10} {'engine':>8} {'seconds':>8} {'tokens':>11} {'tokens/s':>10} {'CPU s':>7} "
              f"{'peak PSS MB':>12}")
        for megabytes in args.mb:
            corpus = Path(work) / f"corpus-{megabytes:g}mb"
            size = write_corpus(corpus, megabytes)
            runs = {engine: measured(engine, corpus, tokenizer, args.workers) for engine in ENGINES}
            for engine, r in runs.items():
                print(f"{size / 1e6:>8.1f}MB {engine:>8} {r['seconds']:>8.1f} {r['tokens']:>11,} "
                      f"{r['tokens_per_s']:>10,.0f} {r['cpu_s']:>7.1f} {r['peak_mb']:>12.0f}")
            if runs["memory"]["tokens"] != runs["litdata"]["tokens"]:
                raise RuntimeError("the engines wrote different token counts")
            speed, cpu, memory = (runs["litdata"][k] / runs["memory"][k]
                                  for k in ("tokens_per_s", "cpu_s", "peak_mb"))
            print(f"{'':>10} litdata/memory: tokens/s x{speed:.2f}, CPU s x{cpu:.2f}, "
                  f"peak memory x{memory:.2f}")


if __name__ == "__main__":
    main()
