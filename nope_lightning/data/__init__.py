"""Corpora, tokenizer, packed token files and the LightningDataModule (see each module's docstring)."""

from nope_lightning.data.corpus import SOURCES, Document, load_documents, split_documents
from nope_lightning.data.datamodule import PackedDataModule
from nope_lightning.data.prepare import PreparedData, prepare
from nope_lightning.data.tokenizer import TextTokenizer

__all__ = ["SOURCES", "Document", "PackedDataModule", "PreparedData", "TextTokenizer", "load_documents",
           "prepare", "split_documents"]
