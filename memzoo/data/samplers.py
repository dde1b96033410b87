"""Documents cut into the batches the model reads: random training windows (`WindowSampler`), rows that
stream documents to their end with the state carried (`StreamSampler`), and evaluation streams."""
from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch import Tensor

from memzoo.core.config import ConfigError
from memzoo.data.copy_reads import CopyReads
from memzoo.data.corpus import Batch, Document


def num_segments(doc_len: int, n: int) -> int:
    """Segments needed to predict every byte after the first."""
    return max(0, -(-(doc_len - 1) // n))


def _fill_segment(row: dict[str, Tensor], b: int, s: int, data: Tensor, j: int, n: int) -> None:
    """Write segment j of a document (bytes `data`) into row b, slot s."""
    start = j * n
    chunk = data[start : start + n + 1]
    m = chunk.numel() - 1
    row["tokens"][b, s, :m] = chunk[:-1]
    row["targets"][b, s, :m] = chunk[1:]
    row["mask"][b, s, :m] = True


def _empty(batch_size: int, s: int, n: int) -> dict[str, Tensor]:
    return {
        "tokens": torch.zeros(batch_size, s, n, dtype=torch.long),
        "targets": torch.zeros(batch_size, s, n, dtype=torch.long),
        "mask": torch.zeros(batch_size, s, n, dtype=torch.bool),
        "reset": torch.zeros(batch_size, s, dtype=torch.bool),
        "seg_index": torch.full((batch_size, s), -1, dtype=torch.long),
    }


def training_documents(docs: list[Document], segment_len: int) -> tuple[list[Tensor], Tensor]:
    """Each document's bytes as a tensor and its segment count (float64, the sampling weights); a corpus
    with no segment to train on is refused."""
    tensors = [torch.frombuffer(bytearray(d.data), dtype=torch.uint8).long() for d in docs]
    nseg = torch.tensor([num_segments(len(d.data), segment_len) for d in docs], dtype=torch.float64)
    if float(nseg.sum()) == 0:
        raise ConfigError(f"no training document is longer than one byte at segment_len={segment_len}")
    return tensors, nseg


class WindowSampler:
    """Training windows of S segments per row, deterministic in (seed, step) so resuming is exact.

    Each row starts at a random segment of a random document (chosen in proportion to its
    segments) with a fresh state; when the document ends, the row continues with the next random
    document from its first segment, with a reset flag.
    """

    def __init__(self, docs: list[Document], segment_len: int, seed: int):
        self.n = segment_len
        self.seed = seed
        self.docs, self.nseg = training_documents(docs, segment_len)

    def sample(self, step: int, batch_size: int, window_segments: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        out = _empty(batch_size, window_segments, self.n)
        for b in range(batch_size):
            doc = int(torch.multinomial(self.nseg, 1, generator=gen))
            j = int(torch.randint(int(self.nseg[doc]), (1,), generator=gen))
            out["reset"][b, 0] = True
            for s in range(window_segments):
                if j >= self.nseg[doc]:
                    doc, j = int(torch.multinomial(self.nseg, 1, generator=gen)), 0
                    out["reset"][b, s] = True
                _fill_segment(out, b, s, self.docs[doc], j, self.n)
                out["seg_index"][b, s] = j
                j += 1
        return Batch(**out)


class StreamSampler:
    """Training windows that follow documents from their first byte, so a carried state is as old in
    training as in evaluation (truncated BPTT over a stream, as Transformer-XL and RMT train).

    Row b reads its own endless sequence of documents, each drawn at random (in proportion to its
    segments, from a generator seeded by (seed, b, k) for the row's k-th document) and read for at most
    `max_doc_segments` segments (None: to its end), from its first segment (doc_start "first", as
    evaluation reads) or from one drawn at random among those that leave a full read ("random": every
    stretch of a long document is trained on, not only its head). Step t's window is segments
    t*S .. t*S + S - 1 of that sequence, so consecutive steps are consecutive windows of the same
    documents; a read's first segment carries the reset flag, and seg_index counts from it.
    Deterministic in (seed, step): a resumed run reads exactly the windows it would have read (the
    carried state is the checkpoint's).
    """

    DOC_STARTS = ("first", "random")

    def __init__(self, docs: list[Document], segment_len: int, seed: int, max_doc_segments: Optional[int] = None,
                 doc_start: str = "first", copy: Optional[CopyReads] = None):
        if max_doc_segments is not None and max_doc_segments < 1:
            raise ConfigError(f"train.max_doc_segments={max_doc_segments}; expected a positive number of segments or null")
        if doc_start not in self.DOC_STARTS:
            raise ConfigError(f"train.doc_start={doc_start!r}; expected one of {', '.join(self.DOC_STARTS)}")
        if copy is not None and copy.share > 0 and max_doc_segments is None:
            raise ConfigError("train.copy_share > 0 needs train.max_doc_segments (the copy reads' length)")
        self.n, self.seed, self.cap, self.doc_start = segment_len, seed, max_doc_segments, doc_start
        self.copy = copy if copy is not None and copy.share > 0 else None
        self.docs, self.nseg = training_documents(docs, segment_len)
        # row -> (k, bytes read, its first segment read, position of that read in the row's sequence, its length)
        self._cursor: dict[int, tuple[int, Tensor, int, int, int]] = {}

    def _document(self, row: int, k: int) -> tuple[Tensor, int, int]:
        """The row's k-th read: (its bytes, first segment read of them, segments read). With copy reads,
        a share of reads is a copy read instead (memzoo.data.copy_reads); layout text-pairs draws one more
        document, the donor its chunks are cut from, after the read's own draws."""
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + row) * 1_000_033 + k)
        doc = int(torch.multinomial(self.nseg, 1, generator=gen))
        if self.copy is not None and float(torch.rand((), generator=gen)) < self.copy.share:
            assert self.cap is not None
            donor = None
            if self.copy.layout == "text-pairs":  # the chunks' donor, drawn like a read (now and then this one)
                donor = self.docs[int(torch.multinomial(self.nseg, 1, generator=gen))]
            data, length = self.copy.read(self.docs[doc], int(self.nseg[doc]), self.cap, self.n, gen, donor)
            return data, 0, length
        total = int(self.nseg[doc])
        length = total if self.cap is None else min(total, self.cap)
        start = 0
        if self.doc_start == "random" and total > length:  # every full read equally likely
            start = int(torch.randint(0, total - length + 1, (1,), generator=gen))
        return self.docs[doc], start, length

    def _locate(self, row: int, position: int) -> tuple[Tensor, int, int]:
        """(bytes of the read, its first segment, segment within the read) at the row's `position`-th
        segment, walking forward from a cache."""
        if row not in self._cursor or position < self._cursor[row][3]:  # first call, or an earlier step asked for
            data, start, length = self._document(row, 0)
            self._cursor[row] = (0, data, start, 0, length)
        k, data, start, first, length = self._cursor[row]
        while position >= first + length:
            k, first = k + 1, first + length
            data, start, length = self._document(row, k)
        self._cursor[row] = (k, data, start, first, length)
        return data, start, position - first

    def sample(self, step: int, batch_size: int, window_segments: int) -> Batch:
        out = _empty(batch_size, window_segments, self.n)
        for b in range(batch_size):
            for s in range(window_segments):
                data, start, i = self._locate(b, step * window_segments + s)
                _fill_segment(out, b, s, data, start + i, self.n)
                out["seg_index"][b, s] = i
                out["reset"][b, s] = i == 0
        return Batch(**out)


def stream_documents(docs: list[Document], batch_size: int, segment_len: int,
                     max_segments_per_doc: Optional[int] = None) -> Iterator[Batch]:
    """Whole documents from their first byte, one segment per step ([B, 1, N]), packed into rows.

    A row moves to its next document (reset flag) when one ends; rows with nothing left are fully
    masked. Used by evaluation and streaming: the state carries across steps.
    """
    queue = list(range(len(docs)))
    tensors = [torch.frombuffer(bytearray(d.data), dtype=torch.uint8).long() for d in docs]
    limits = [num_segments(len(d.data), segment_len) for d in docs]
    if max_segments_per_doc is not None:
        limits = [min(x, max_segments_per_doc) for x in limits]
    current: list[Optional[int]] = [None] * batch_size
    position = [0] * batch_size
    while True:
        out = _empty(batch_size, 1, segment_len)
        doc_index = torch.full((batch_size, 1), -1, dtype=torch.long)  # [B, 1]
        active = False
        for b in range(batch_size):
            if current[b] is None or position[b] >= limits[current[b]]:
                current[b] = None
                while queue:
                    d = queue.pop(0)
                    if limits[d] > 0:
                        current[b], position[b] = d, 0
                        out["reset"][b, 0] = True
                        break
            if current[b] is None:
                continue
            active = True
            _fill_segment(out, b, 0, tensors[current[b]], position[b], segment_len)
            out["seg_index"][b, 0] = position[b]
            doc_index[b, 0] = current[b]
            position[b] += 1
        if not active:
            return
        yield Batch(**out, doc_index=doc_index)
