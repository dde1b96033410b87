"""Hugging Face corpora through the `datasets` library: `data.source=hf:NAME[:CONFIG][:SPLIT]`.

The dataset is opened with streaming=True and read example by example (one document per example,
its text in `data.text_field`), stopping after `data.max_docs` documents, so a corpus like PG-19 is
never loaded whole: only the documents kept sit in memory. Documents are named
`NAME[:CONFIG]/SPLIT/INDEX` (INDEX: position in the stream) and split train/valid/test by a hash of
that name, as files are by path. Local files go through datasets' own loaders:
`hf:json`, `hf:parquet`, `hf:csv`, `hf:text` with `data.hf_data_files=FILE_OR_GLOB`.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

from memzoo.core.config import ConfigError, DataConfig


def parse_source(source: str) -> tuple[str, Optional[str], str]:
    """'hf:NAME[:CONFIG][:SPLIT]' -> (NAME, CONFIG or None, SPLIT, default 'train')."""
    parts = source[len("hf:"):].split(":")
    if not parts[0] or len(parts) > 3:
        raise ConfigError(f"data.source={source!r}; expected hf:NAME[:CONFIG][:SPLIT], e.g. hf:pg19 or "
                          f"hf:wikitext:wikitext-103-raw-v1:train")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "train"
    return name, config, split


def _open(cfg: DataConfig, name: str, config: Optional[str], split: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"data.source={cfg.source!r} needs the datasets library: pip install 'memzoo[datasets]'") from None
    kwargs: dict[str, Any] = {"split": split, "streaming": True}
    if cfg.hf_data_files:
        kwargs["data_files"] = cfg.hf_data_files
    return datasets.load_dataset(name, config, **kwargs)


def _unavailable(cfg: DataConfig, name: str, err: BaseException) -> ConfigError:
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return ConfigError(
        f"data.source={cfg.source!r}: could not read the Hugging Face dataset {name!r} ({type(err).__name__}: {first}). "
        f"Without network, pre-download it (e.g. `huggingface-cli download --repo-type dataset {name} --local-dir DIR`, "
        f"then data.source=hf:parquet data.hf_data_files='DIR/**/*.parquet') or point data.source at local files "
        f"(a file, a folder or a glob)"
    )


def iter_examples(cfg: DataConfig) -> Iterator[tuple[str, bytes]]:
    """(document name, UTF-8 bytes) for each example of the stream, in stream order."""
    name, config, split = parse_source(cfg.source)
    try:
        stream = iter(_open(cfg, name, config, split))
    except ConfigError:
        raise
    except Exception as err:  # network, missing dataset or file: one clear message
        raise _unavailable(cfg, name, err) from err
    prefix = f"{name}:{config}" if config else name
    index = 0
    while True:
        try:
            example = next(stream)
        except StopIteration:
            return
        except Exception as err:  # the stream can fail later too (network dropped)
            raise _unavailable(cfg, name, err) from err
        if cfg.text_field not in example:
            raise ConfigError(f"data.text_field={cfg.text_field!r} is not a field of {cfg.source!r}; "
                              f"its fields: {', '.join(example)}")
        text = example[cfg.text_field]
        yield f"{prefix}/{split}/{index:09d}", (text or "").encode("utf-8")
        index += 1
