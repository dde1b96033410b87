"""checks/resume_check.py: on the CPU a resumed run equals the straight one bitwise, and a resume
that does not restore the RNG (dropout drawn differently) is reported as a failure, not passed."""
from __future__ import annotations

from pathlib import Path

import checks.resume_check as resume_check


def test_a_resume_matches_the_straight_run_and_a_lost_rng_state_is_caught(tmp_path: Path, monkeypatch) -> None:
    row = resume_check.check("local", "cpu", tmp_path / "right")
    assert row["ok"] and row["note"] == "bitwise equal"

    import memzoo.training.train as train_module

    monkeypatch.setattr(train_module, "restore_rng_states", lambda ckpt, device: None)
    row = resume_check.check("local", "cpu", tmp_path / "lost")
    assert not row["ok"] and float(row["max_rel_diff"]) > resume_check.TOL
