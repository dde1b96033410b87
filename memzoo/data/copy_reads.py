"""Copy reads: training reads that only copying can predict, mixed into a corpus stream so that a
backbone learns to look up what it has seen at every distance it will be evaluated at.

A copy read is a random string of d printable bytes written over and over (period d) to the read's
length: every byte after the first d is the byte exactly d positions back, and nothing else predicts
it (the string has no structure). d is drawn log-uniformly in [min_distance, max_distance] per read,
so short and long distances are trained alike. As d varies from read to read, no head that looks a
fixed distance back predicts them: only a lookup by content (an induction head) does, which natural
text, repeating too rarely, teaches too slowly for a CPU budget (docs/protocols/backbone.md).

Layout "pairs" keeps the read's own document and writes random printable chunks (16..64 bytes) into
it twice, d apart: each chunk has one earlier occurrence, inside text, as the copy probe
(memzoo.evaluations.copy_distance) and natural repeats have it, where a periodic read lets a model
continue the string from any earlier period without telling text from what to copy.

Layout "text-pairs" writes the pairs the same way, but each chunk is cut from a donor document (drawn
like any read, so now and then the read's own) instead of random bytes. A random chunk is told apart by
its bytes alone, and 4,000 bytes back its last four bytes match no wrong place (its last two, 0.42); a
text chunk looks like its surroundings and its last four bytes match about twenty wrong places
(experiments/window/copy_ambiguity.json). So only text pairs make a lookup keyed on many bytes pay, which
copying held-out text at distance needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from memzoo.core.config import ConfigError

PRINTABLE = torch.arange(32, 127)  # the 95 printable ASCII bytes: the string looks like text to the model


@dataclass(frozen=True)
class CopyReads:
    """share: the fraction of reads that are copy reads; distances: [min, max] period in bytes."""

    share: float
    min_distance: int
    max_distance: int
    layout: str = "periodic"  # periodic | pairs | text-pairs (module docstring)
    min_chunk: int = 16
    max_chunk: int = 64
    draw: str = "log-uniform"  # how d is drawn in [min, max]: log-uniform (short and long alike) | uniform

    LAYOUTS = ("periodic", "pairs", "text-pairs")
    DRAWS = ("log-uniform", "uniform")

    def __post_init__(self) -> None:
        if self.layout not in self.LAYOUTS:
            raise ConfigError(f"train.copy_layout={self.layout!r}; expected one of {', '.join(self.LAYOUTS)}")
        if self.draw not in self.DRAWS:
            raise ConfigError(f"train.copy_draw={self.draw!r}; expected one of {', '.join(self.DRAWS)}")
        if not 0.0 <= self.share <= 1.0:
            raise ConfigError(f"train.copy_share={self.share}; expected a fraction in [0, 1]")
        if not 1 <= self.min_distance <= self.max_distance:
            raise ConfigError(f"train.copy_distance=[{self.min_distance}, {self.max_distance}]; expected "
                              "two byte distances 1 <= min <= max")

    def distance(self, gen: torch.Generator) -> int:
        """A period drawn in [min_distance, max_distance]: log-uniformly (as many in 16..256 as in 256..4,096)
        or uniformly (each distance alike: most draws long, where log-uniform leaves long pairs rare)."""
        u = float(torch.rand((), generator=gen))
        if self.draw == "uniform":
            return min(self.max_distance, self.min_distance + int(u * (self.max_distance - self.min_distance + 1)))
        lo, hi = math.log(self.min_distance), math.log(self.max_distance + 1)
        return min(self.max_distance, int(math.exp(lo + u * (hi - lo))))

    def make(self, length: int, gen: torch.Generator) -> Tensor:
        """One copy read of `length` bytes: a random printable string of d bytes repeated. [length]"""
        d = self.distance(gen)
        string = PRINTABLE[torch.randint(len(PRINTABLE), (d,), generator=gen)]  # [d]
        return string.repeat(-(-length // d))[:length]

    def read(self, document: Tensor, doc_segments: int, segments: int, segment_len: int,
             gen: torch.Generator, donor: Optional[Tensor] = None) -> tuple[Tensor, int]:
        """A copy read in place of `document` (its bytes [T], `doc_segments` long), `segments` long at most:
        (its bytes, its segments). Periodic: the string, `segments` long; pairs: the document's head with
        chunks written into it (text-pairs: chunks cut from `donor`, a donor document's bytes [T'])."""
        if self.layout == "periodic":
            return self.make(segments * segment_len + 1, gen), segments
        if self.layout == "text-pairs" and donor is None:
            raise ValueError("copy_layout='text-pairs' cuts its chunks from a donor document; none was given")
        length = min(doc_segments, segments)
        text_donor = donor if self.layout == "text-pairs" else None  # "pairs" writes random chunks, always
        return self.write_pairs(document[: length * segment_len + 1], gen, text_donor), length

    def chunk(self, m: int, gen: torch.Generator, donor: Optional[Tensor]) -> Tensor:
        """m bytes to write twice: random printable ones, or m consecutive bytes of `donor` (random ones
        when the donor is shorter than m). [m]"""
        if donor is None or len(donor) < m:
            return PRINTABLE[torch.randint(len(PRINTABLE), (m,), generator=gen)]
        at = int(torch.randint(len(donor) - m + 1, (), generator=gen))
        return donor[at:at + m]

    def write_pairs(self, text: Tensor, gen: torch.Generator, donor: Optional[Tensor] = None,
                    tries: int = 64) -> Tensor:
        """`text` with chunks (random printable, or cut from `donor`) written twice each, the second copy's
        bytes each exactly d after the first's (d drawn as `distance`), the pairs never overlapping, until
        half the bytes are chunks or `tries` draws found no free place. [len(text)] (a new tensor)"""
        out, taken = text.clone(), torch.zeros(len(text), dtype=torch.bool)  # [L], [L]
        for _ in range(tries):
            if int(taken.sum()) * 2 >= len(text):
                break
            m = int(torch.randint(self.min_chunk, self.max_chunk + 1, (), generator=gen))
            d = max(self.distance(gen), m)  # the second copy starts after the first ends
            if d + m > len(text):
                continue
            p = int(torch.randint(len(text) - d - m + 1, (), generator=gen))
            first, second = slice(p, p + m), slice(p + d, p + d + m)
            if bool(taken[first].any() or taken[second].any()):
                continue
            chunk = self.chunk(m, gen, donor)  # [m]
            out[first], out[second] = chunk, chunk
            taken[first], taken[second] = True, True
        return out
