"""A tiny tokenizer and tiny text datasets, built here (nothing downloaded): what ``slimpack
lengths`` reads in the field, a Hugging Face tokenizer.json and a save_to_disk directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TEXTS = ["the cat sat", "the cat", "", "sat sat sat sat", "a dog"]
WORDS = [3, 2, 0, 4, 2]  # "a" and "dog" are unknown words: one [UNK] token each
"""Tokens per text without special tokens (the tokenizer splits on whitespace)."""
BOS = "<s>"


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer whose post-processor puts ``<s>`` before every document."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    vocab = {"[UNK]": 0, BOS: 1, "the": 2, "cat": 3, "sat": 4}
    tokenizer = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def write_saved_dataset(directory: Path, texts: list[str]) -> Path:
    """The layout of ``datasets.Dataset.save_to_disk``: arrow files in the IPC stream format, listed in
    state.json, beside dataset_info.json."""
    pa = pytest.importorskip("pyarrow")
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    halves = [table.slice(0, 2), table.slice(2)]  # two shards, read back in state.json's order
    names = [f"data-0000{i}-of-00002.arrow" for i in range(2)]
    for name, part in zip(names, halves, strict=True):
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                      "_fingerprint": "0", "_split": None}))
    (directory / "dataset_info.json").write_text("{}")
    return directory
