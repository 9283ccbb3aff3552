"""Generated tokens as text, piece by piece: never half a character, never the start of a stop string.

Each push decodes all tokens so far and hands out what is new. A trailing U+FFFD is held back (the
bytes of a multi-byte character may still be arriving), and so is a tail that could begin a stop
string; once a stop string appears the text is cut in front of it.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, [s for s in stops if s]
        self.tokens: list[int] = []
        self.sent = 0  # characters handed out so far
        self.stopped = False

    def _text(self) -> str:
        return self.tokenizer.decode(self.tokens) if self.tokenizer is not None else ""

    def push(self, token: int) -> str:
        """The new text that is safe to send after ``token``; sets ``stopped`` when a stop string appeared."""
        self.tokens.append(token)
        text = self._text()
        cut = min((i for i in (text.find(s, max(0, self.sent - len(s) + 1)) for s in self.stops) if i >= 0),
                  default=-1)
        if cut >= 0:
            self.stopped = True
            return self._take(text, cut)
        end = len(text.rstrip(REPLACEMENT)) if text.endswith(REPLACEMENT) else len(text)
        hold = max((k for stop in self.stops for k in range(1, min(len(stop) - 1, end - self.sent) + 1)
                    if text[end - k:end] == stop[:k]), default=0)  # a tail that may begin a stop string
        return self._take(text, end - hold)

    def finish(self) -> str:
        """Whatever was held back, at the end of the sequence (a stop string never completed)."""
        return "" if self.stopped else self._take(self._text(), None)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        piece = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece


__all__ = ["IncrementalText"]
