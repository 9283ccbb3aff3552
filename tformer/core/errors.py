"""One exception type for bad input: the CLI turns it into one line and exit status 2."""

from __future__ import annotations

import os

LINE_LIMIT = 300  # the most characters an error line prints, whatever the message quotes
FULL_ERRORS = "TFORMER_FULL_ERRORS"  # set to 1: print an error line whole


class TformerError(ValueError):
    """Bad input from the user: an impossible config, an unknown name, a corrupt file.

    The message names the problem and the fix, in one line.
    """


def error_line(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` as one line of at most ``limit`` characters. A message that quotes what it found (every tensor name
    of a file, a count of a million digits) is cut in its middle, where the quotation sits, so its start (the
    problem) and its end (the fix) both stay; TFORMER_FULL_ERRORS=1 prints it whole."""
    line = " ".join(str(text).splitlines())
    if len(line) <= limit or os.environ.get(FULL_ERRORS, "") not in ("", "0"):
        return line
    def note(cut: str) -> str:
        return f" [... {cut} characters cut; {FULL_ERRORS}=1 shows all] "

    keep = limit - len(note(f"{len(line):,}"))  # the note at its longest: what it says fits, whatever is cut
    head = keep * 3 // 5
    tail = keep - head
    return line[:head] + note(f"{len(line) - head - tail:,}") + line[len(line) - tail:]


__all__ = ["FULL_ERRORS", "LINE_LIMIT", "TformerError", "error_line"]
