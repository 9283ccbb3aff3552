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
    """``text`` as one line of at most ``limit`` characters, TFORMER_FULL_ERRORS=1 printing it whole. What makes a
    line long is what it quotes: a path (then its middle goes, keeping where it starts and the file it names), or
    a list (every tensor name of a file: then the line's middle goes, where the list sits), so the problem at the
    start and the fix at the end both stay."""
    line = " ".join(str(text).splitlines())
    if len(line) <= limit or os.environ.get(FULL_ERRORS, "") not in ("", "0"):
        return line
    for longest in (64, 48, 36):  # long words (paths, huge numbers) first, less of each until the line fits
        line = " ".join(_shorten(word, longest) for word in line.split(" "))
        if len(line) <= limit:
            return line

    def note(cut: str) -> str:
        return f" [... {cut} characters cut; {FULL_ERRORS}=1 shows all] "

    keep = limit - len(note(f"{len(line):,}"))  # the note at its longest: what it says fits, whatever is cut
    head = _word_end(line, keep * 3 // 5)  # whole words on both sides of the cut
    start = len(line) - (keep - head)
    space = line.find(" ", start)
    start = space + 1 if 0 <= space - start <= 24 else start
    return line[:head] + note(f"{start - head:,}") + line[start:]


def _word_end(line: str, at: int) -> int:
    """``at`` moved to the end of the word it falls in (at most 24 characters on)."""
    space = line.find(" ", at)
    return space if 0 <= space - at <= 24 else at


def _shorten(word: str, longest: int) -> str:
    """A word of more than ``longest`` characters as its start, "...", and its end (a path keeps its file name)."""
    if len(word) <= longest:
        return word
    tail = (longest - 3) * 2 // 3
    return word[:longest - 3 - tail] + "..." + word[len(word) - tail:]


__all__ = ["FULL_ERRORS", "LINE_LIMIT", "TformerError", "error_line"]
