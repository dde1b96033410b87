"""Hugging Face corpora (`data.source=hf:...`), offline: a JSON-lines file loaded through datasets'
local loader keeps one document per example (bytes exact), splits deterministically by name, is
streamed, and a dataset that cannot be reached gives an error that says what to do."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before datasets is imported: no test may touch the network
os.environ["HF_HUB_OFFLINE"] = "1"
datasets = pytest.importorskip("datasets")

from memzoo.core.config import ConfigError  # noqa: E402
from memzoo.data.corpus import load_documents, split_documents, split_of  # noqa: E402
from memzoo.data.hf import parse_source  # noqa: E402
from memzoo.runs.configure import load_config  # noqa: E402

TEXTS = [f"doc {i}: " + "naïve café " * (3 + 7 * i) + "\n" for i in range(30)] + ["short"]


def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(TEXTS)))
    return path


def data_config(tmp_path: Path, *extra: str):
    return load_config("local", ["data.source=hf:json", f"data.hf_data_files={corpus(tmp_path)}",
                                 "data.text_field=body", "data.min_doc_bytes=16", *extra]).data


def test_one_document_per_example_with_exact_bytes_and_a_deterministic_split(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(k) or real(*a, **k))
    cfg = data_config(tmp_path)
    docs = load_documents(cfg)
    assert calls and calls[0]["streaming"] is True  # read as a stream, never loaded whole
    assert [d.data for d in docs] == [t.encode("utf-8") for t in TEXTS[:-1]]  # "short" < min_doc_bytes
    assert [d.name for d in docs] == [f"json/train/{i:09d}" for i in range(30)]
    assert sum(len(d.data) for d in docs) == sum(len(t.encode()) for t in TEXTS[:-1]) > sum(map(len, TEXTS[:-1]))

    split = split_documents(docs, cfg)
    again = split_documents(load_documents(cfg), cfg)
    assert {k: [d.name for d in v] for k, v in split.items()} == {k: [d.name for d in v] for k, v in again.items()}
    for part, members in split.items():
        assert all(split_of(d.name, cfg.valid_fraction, cfg.test_fraction) == part for d in members)
    assert split["train"] and split["valid"] and sum(map(len, split.values())) == 30

    capped = load_documents(data_config(tmp_path, "data.max_docs=4"))
    assert [d.name for d in capped] == [d.name for d in docs[:4]]


def test_source_syntax_and_fields(tmp_path: Path) -> None:
    assert parse_source("hf:pg19") == ("pg19", None, "train")
    assert parse_source("hf:wikitext:wikitext-103-raw-v1") == ("wikitext", "wikitext-103-raw-v1", "train")
    assert parse_source("hf:wikitext:wikitext-103-raw-v1:validation") == ("wikitext", "wikitext-103-raw-v1", "validation")
    with pytest.raises(ConfigError, match="hf:NAME"):
        parse_source("hf:a:b:c:d")
    with pytest.raises(ConfigError, match="data.text_field='text'.*id, body"):
        load_documents(data_config(tmp_path, "data.text_field=text"))


def test_unreachable_dataset_says_to_predownload_or_use_local_files() -> None:
    cfg = load_config("local", ["data.source=hf:memzoo-tests/no-such-corpus:cfg1"]).data
    with pytest.raises(ConfigError) as err:
        load_documents(cfg)
    text = str(err.value)
    assert "'memzoo-tests/no-such-corpus'" in text and "pre-download" in text and "data.source at local files" in text
