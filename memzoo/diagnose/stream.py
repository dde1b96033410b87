"""The `distance` suite's own examples streamed through a trained run's state, one segment at a time,
with the queries' segment peeked at each gap: what the distance measures read the state beside."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from memzoo.core.model import MemoryModel
from memzoo.evaluations.distance import distance_batch, query_offsets, recall_scores
from memzoo.evaluations.generate import StreamingDecoder


class ProbeStream:
    """The distance examples of one trained run streamed through its state, for the measures that read
    the state at each gap (memzoo.diagnose.state_drift, deltanet_retention, infini_pairs_share): feed
    through the last write, then to each gap, and peek the queries' segment there."""

    def __init__(self, model: MemoryModel, layout: dict[str, int], longest_gap: int, trials: int, seed: int = 0,
                 segments_per_call: int = 64):
        self.n = model.cfg.segment_len
        self.batch = distance_batch(layout, longest_gap, trials, self.n, seed)
        self.examples = [self.batch.example(row) for row in range(trials)]
        self.data = self.batch.tokens.long()  # [B, (R + G_max + 1) N]
        self.query = self.data[:, self.batch.query_segment * self.n :]  # [B, N]
        self.offsets = query_offsets(self.batch, self.examples, self.n)
        self.decoder = StreamingDecoder(model, trials, segments_per_call, "fp32")
        self.last_write = int(self.batch.pairs_segment[0]) + layout["rewrites"]  # the pairs open segment 0
        self.done = 0  # tokens fed so far

    def feed_to(self, stop: int) -> None:
        """Feed the stream up to token `stop` (nothing when it is already there)."""
        if stop > self.done:
            self.decoder.feed(self.data[:, self.done : stop])
            self.done = stop

    def feed_writes(self) -> None:
        """Through the last segment that writes the answers."""
        self.feed_to((self.last_write + 1) * self.n)

    def feed_to_gap(self, gap: int) -> None:
        """Up to the queries' segment at `gap` (every segment before it)."""
        self.feed_to((self.last_write + gap) * self.n)

    def peek(self) -> tuple[Tensor, dict[str, Any]]:
        """The queries' segment read from the state without committing it: logits [B, N, V] and recall_scores."""
        logits = self.decoder.peek(self.query)
        predicted = [logits[i, self.offsets[i]].argmax(-1).tolist() for i in range(len(self.examples))]
        return logits, recall_scores(predicted, self.examples)
