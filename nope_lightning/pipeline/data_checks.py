"""The dry run's checks of a step's data against a cached preparation of its corpus: the train split's size
against the tokens a run reads, and the longest document against an evaluation's windows. Nothing is prepared: a
corpus never prepared is "unchecked" until it is."""

from __future__ import annotations

import json

from nope_lightning.config.data import DataConfig


def cached_documents(data: DataConfig, split: str) -> list[int] | None:
    """Token lengths of the documents of ``split`` from a cached preparation of ``data`` (the newest one of the
    same corpus, vocabulary and split settings); None when it was never prepared (then it is unchecked)."""
    settings = {"seed": data.split_seed, "val_fraction": data.val_fraction, "test_fraction": data.test_fraction}
    manifests = sorted(data.cache_path.glob("prepared/*/manifest.json"), key=lambda p: p.stat().st_mtime,
                       reverse=True)
    for path in manifests:
        manifest = json.loads(path.read_text())
        if (manifest["corpus"], manifest["vocab_size_requested"], manifest["split"]) == (
                data.corpus, data.vocab_size, settings):
            return json.loads((path.parent / f"{split}.json").read_text())["lengths"]
    return None


def check_training_data(entry: dict, data: DataConfig, tokens: int, length: int) -> None:
    """Record the train split's size against the ``tokens`` a run reads in windows of ``length`` tokens."""
    documents = cached_documents(data, "train")
    if documents is None:
        entry["data"] = {"corpus": data.corpus, "train_tokens": "unchecked: known once the corpus is prepared"}
        return
    available = sum(documents)
    entry["data"] = {"corpus": data.corpus, "train_tokens": available, "epochs": round(tokens / available, 2)}
    if available < length + 1:
        entry["problems"].append(f"the train split of {data.corpus!r} has {available} tokens, fewer than one "
                                 f"window of {length + 1}; use a larger corpus or a shorter length")


def check_documents(entry: dict, data: DataConfig, split: str, longest: int) -> None:
    """Evaluation windows of ``longest`` tokens need a ``split`` document of ``longest + 1`` tokens."""
    documents = cached_documents(data, split)
    if documents is None:
        entry["data"] = {"corpus": data.corpus, f"longest_{split}_document": "unchecked: known once prepared"}
        return
    entry["data"] = {"corpus": data.corpus, f"longest_{split}_document": max(documents)}
    if max(documents) < longest + 1:
        entry["problems"].append(f"no {split} document of {data.corpus!r} has {longest + 1} tokens (longest: "
                                 f"{max(documents)}); lower the lengths or use a corpus with longer documents")
