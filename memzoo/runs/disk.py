"""Writes into run and suite folders that run out of space. A full disk (OSError ENOSPC or EDQUOT, or
the RuntimeError torch.save gives for a short write) becomes one DiskFullError line naming the folder,
what was being written and the space left there, and an atomic write leaves no temporary file behind,
so the file it replaces (the previous checkpoint) stays whole and a re-run resumes from it."""
from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# What torch.save's C++ writer says when its file takes fewer bytes than it wrote (no errno reaches Python).
TORCH_SHORT_WRITE = ("unexpected pos", "file write failed", "failed writing file", "iostream error")
AGAIN = "free some space, then run the same command again (runs resume from their last checkpoint)"


class DiskFullError(Exception):
    """A write that failed for lack of space; its message is the one line the user sees."""


def is_disk_full(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from, is a write that ran out of space."""
    while err is not None:
        if isinstance(err, DiskFullError):
            return True
        if isinstance(err, OSError) and err.errno in NO_SPACE:
            return True
        if isinstance(err, RuntimeError) and any(m in str(err) for m in TORCH_SHORT_WRITE):
            return True
        err = err.__cause__
    return False


def size_text(n: float) -> str:
    """Bytes as people read them: 512 B, 5.9 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def free_text(folder: Path) -> str:
    """The space left on `folder`'s file system (its nearest existing parent's), as text."""
    where = Path(folder)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return f"{size_text(shutil.disk_usage(where).free)} free"
    except OSError:
        return "free space unknown"


def disk_full(folder: Path, what: str, written: Optional[int] = None) -> DiskFullError:
    """The one-line error for a write of `what` into `folder` that ran out of space, made when it failed
    (the space left then; `written`: the bytes of the partial file, to be removed)."""
    partial = f"; {size_text(written)} of it written, then removed" if written else ""
    return DiskFullError(f"no space left on the device writing {what} in {folder} ({free_text(folder)} when it failed"
                         f"{partial}); {AGAIN}")


@contextmanager
def writing(folder: Path, what: str) -> Iterator[None]:
    """A write inside the block that runs out of space raises DiskFullError naming `folder` and `what`."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as err:
        if is_disk_full(err):
            raise disk_full(folder, what) from err
        raise


def atomic_write(path: Path, write: Callable[[Path], None], what: str, tmp: Optional[Path] = None) -> None:
    """`write(tmp)`, then rename tmp over `path` (default tmp: PATH.tmp): a reader sees the old file or
    the new one, never half. On any failure the temporary file is removed and `path` left as it was;
    a lack of space is a DiskFullError."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp") if tmp is None else Path(tmp)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        full = None
        if isinstance(err, Exception) and not isinstance(err, DiskFullError) and is_disk_full(err):
            full = disk_full(path.parent, what, tmp.stat().st_size if tmp.exists() else None)
        tmp.unlink(missing_ok=True)
        if full is not None:
            raise full from err
        raise


def atomic_text(path: Path, text: str, what: Optional[str] = None) -> None:
    """`text` written atomically (`atomic_write`); `what` names it in a full disk's error (default: the file's name)."""
    atomic_write(path, lambda tmp: tmp.write_text(text), what or Path(path).name)
