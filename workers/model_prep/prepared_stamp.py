"""What a preparer's finished artifacts were built from, written as its last step: a cache that
holds every file but was built from another wheel version (or opset, or GGUF file) is built
again, not served as it is."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from workers.model_prep.build_folder import temporary_of

STAMP_FILE = ".prepared.json"


def stamp_matches(folder: Path, source: Mapping[str, object]) -> bool:
    """Whether `folder`'s stamp names `source` (no stamp, or an unreadable one, does not)."""
    try:
        return bool(json.loads((folder / STAMP_FILE).read_text()) == source)
    except (OSError, ValueError):
        return False


def write_stamp(folder: Path, source: Mapping[str, object]) -> None:
    """Written whole or not at all: a reader never takes half a stamp for another source."""
    temporary = temporary_of(folder / STAMP_FILE)
    temporary.write_text(json.dumps(source, sort_keys=True))
    os.replace(temporary, folder / STAMP_FILE)
