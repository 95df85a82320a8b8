"""What ``nearrec bench WHAT`` needs of a harness: each harness module declares its own in
``HARNESSES`` (WHAT → ``Harness``), and ``cli.py`` runs every one the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from .report import Record

C = TypeVar("C")


@dataclass(frozen=True)
class Harness(Generic[C]):
    #: the config of a full run, and of a ``--quick`` one
    config: Callable[[], C]
    quick: Callable[[], C]
    #: the flags it takes (as ``cli.FLAGS`` spells them) → the config field each sets when
    #: given; besides these, every harness takes the common flags, of which ``--scratch`` and
    #: ``--out`` set a field only where named here
    flags: Mapping[str, str]
    run: Callable[[C, Callable[[str], None]], list[Record]]
    markdown: Callable[[list[Record], str], str]
    #: the run appends each finished cell to ``OUT/WHAT-progress.jsonl`` (its config's
    #: ``progress_file``), emptied first
    progress: bool = False
    #: draws the records' figures into a PNG (``None`` where it cannot); the Markdown links it
    figure: Callable[[list[Record], Path], Path | None] | None = None
