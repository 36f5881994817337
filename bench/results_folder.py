"""Where a benchmark run writes its results: bench/results/<UTC start>-<commit>[-dirty][-<kind>],
so a folder names the code it measured (a run from a worktree writes into that worktree's
bench/results; copy the folder back before removing the worktree)."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
RESULTS = REPOSITORY / "bench" / "results"


def commit_of(repository: Path = REPOSITORY) -> str | None:
    """The short commit `repository` is at, with '-dirty' where tracked files differ from it;
    None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repository), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(repository), "status", "--porcelain", "--untracked-files=no"],
                                 check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}-dirty" if changed else head


def results_folder(kind: str = "") -> Path:
    """A new folder under RESULTS for a run starting now, named by its start, commit and `kind`."""
    parts = [datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"), commit_of(), kind or None]
    out = RESULTS / "-".join(part for part in parts if part)
    out.mkdir(parents=True, exist_ok=True)
    return out
