"""A conversation with a chat model: the history rendered through the model's own chat template, a reply
generated until the template's end-of-turn token, and the context window kept: when the next prompt and
reply would not fit, the oldest turns are dropped (the system message stays) and the caller is told.

What `tformer chat`, `tformer generate --chat` and the server's /v1/chat/completions share; no terminal, no HTTP.

    chat = Chat(model, tokenizer)                        # the template from tokenizer.chat_template
    reply = chat.send("What is the capital of France?", on_text=print)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tformer.core.errors import TformerError
from tformer.data.chat_template import ChatTemplate, chat_template_for
from tformer.generate.search import GenerationConfig, check_stop_ids, generate

# End-of-turn tokens of the common templates: ChatML (SmolLM, Qwen), Llama 3, Gemma. A reply stops at whichever
# of these the vocabulary has as a single token, and at the model's EOS.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def template_for(tokenizer) -> ChatTemplate:
    """The tokenizer's chat template (from the model file), else plain ChatML when the vocabulary has its tokens."""
    if tokenizer is None:
        raise TformerError("this model has no tokenizer, so it cannot chat; give a model with one (e.g. --gguf)")
    bos, eos = (_piece(tokenizer, getattr(tokenizer, name, None)) for name in ("bos_id", "eos_id"))
    return chat_template_for(getattr(tokenizer, "chat_template", None), _token_strings(tokenizer),
                             bos_token=bos, eos_token=eos)


def stop_ids(tokenizer, eos_id: int | None) -> list[int]:
    """The ids a reply ends at: the model's EOS and every end-of-turn token its vocabulary has whole."""
    ids = [] if eos_id is None else [eos_id]
    for text in END_OF_TURN:
        one = _single(tokenizer, text)
        if one is not None and one not in ids:
            ids.append(one)
    return ids


def _single(tokenizer, text: str) -> int | None:
    try:
        ids = tokenizer.encode(text, special=True)
    except (TypeError, TformerError):
        return None
    return ids[0] if len(ids) == 1 else None


def _piece(tokenizer, token_id) -> str:
    if token_id is None:
        return ""
    return tokenizer.decode([token_id])


def _token_strings(tokenizer) -> set[str]:
    return {text for text in END_OF_TURN + ("<|im_start|>",) if _single(tokenizer, text) is not None}


def chat_ids(template: ChatTemplate, tokenizer, messages: list[dict]) -> list[int]:
    """The template's rendering of ``messages`` (with the assistant's turn opened) as token ids, the template's
    special tokens matched whole (BOS added in front when the tokenizer adds one and the template did not)."""
    text = template.render(messages, add_generation_prompt=True)
    ids = tokenizer.encode(text, special=True)
    bos = getattr(tokenizer, "bos_id", None)
    if getattr(tokenizer, "add_bos", False) and bos is not None and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    return ids


@dataclass
class Turn:
    """One reply: its text and ids, why it ended, and what had to be dropped to fit the context."""

    text: str
    ids: list[int]
    finish: str  # "stop" (end of turn), "length" (max tokens), "interrupted", "context" (the window is full)
    prompt_tokens: int
    dropped: int = 0  # earlier messages left out so that this prompt fit
    seconds: float = 0.0


@dataclass
class Chat:
    """The conversation with ``model``; ``messages`` holds it as the template sees it (system first)."""

    model: object
    tokenizer: object
    template: ChatTemplate | None = None
    system: str | None = None
    settings: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=256))
    messages: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.template = self.template or template_for(self.tokenizer)
        self.stops = stop_ids(self.tokenizer, self.model.config.eos_token_id)
        # The caller's own stop ids (--stop-ids) end a reply too, beside end of turn; checked here, before the first
        # message, since `tformer chat` reports a failed send and goes on.
        asked = self.settings.stop_tokens
        asked = check_stop_ids([asked] if isinstance(asked, int) else asked or [], self.model.config.vocab_size)
        self.stops += [t for t in dict.fromkeys(asked) if t not in self.stops]
        if not self.stops:
            raise TformerError("the model has no end-of-sequence or end-of-turn token, so a reply would never end; "
                               "give a chat model")

    def reset(self) -> None:
        self.messages = []

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return chat_ids(self.template, self.tokenizer, messages)

    def _history(self, user: str) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages + [{"role": "user", "content": user}]

    def fit(self, messages: list[dict]) -> tuple[list[int], int]:
        """(prompt ids, messages dropped): the oldest user/assistant pairs go until prompt + reply fit."""
        window = self.model.config.max_positions
        room = window - self.settings.max_new_tokens
        if room < 1:
            raise TformerError(f"max tokens {self.settings.max_new_tokens} leaves no room for a prompt in the "
                               f"model's context of {window}; ask for fewer")
        system = [m for m in messages[:1] if m["role"] == "system"]
        rest = messages[len(system):]
        dropped = 0
        while True:
            ids = self.prompt_ids(system + rest)
            if len(ids) <= room:
                return ids, dropped
            if len(rest) <= 1:
                raise TformerError(f"the message alone takes {len(ids)} tokens; with {self.settings.max_new_tokens} "
                                   f"for the reply it does not fit the context of {window}: shorten it")
            cut = 2 if len(rest) > 2 else 1  # a user turn and its reply leave together
            rest, dropped = rest[cut:], dropped + cut

    def send(self, user: str, on_text: Callable[[str], None] | None = None,
             stop_requested: Callable[[], bool] | None = None) -> Turn:
        """Add the user's message, generate the reply (streamed to ``on_text`` piece by piece) and keep both.

        ``stop_requested()`` is polled between tokens: True ends the reply there (kept, marked "interrupted")."""
        messages = self._history(user)
        ids, dropped = self.fit(messages)
        if dropped:  # the history itself loses them: the next prompt must not grow back past the window
            self.messages = self.messages[dropped:]
        pieces = _Pieces(self.tokenizer)
        produced: list[int] = []

        class _Stop(Exception):
            pass

        def streamer(tokens):
            token = int(tokens[0])
            if token in self.stops:
                return
            produced.append(token)
            piece = pieces.push(token)
            if piece and on_text is not None:
                on_text(piece)
            if stop_requested is not None and stop_requested():
                raise _Stop

        finish = "stop"
        out = None
        try:
            out = generate(self.model, [ids], config=self.settings, stop_tokens=self.stops, streamer=streamer)
        except (_Stop, KeyboardInterrupt):
            finish = "interrupted"
        tail = pieces.finish()
        if tail and on_text is not None:
            on_text(tail)
        if out is not None:
            ended = out.sequences[0][-1:] and out.sequences[0][-1] in self.stops
            finish = "stop" if ended else ("context" if out.hit_context_limit else "length")
        text = self.tokenizer.decode(produced, skip_special=True)
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": text}]
        seconds = (out.prefill_seconds + out.decode_seconds) if out is not None else 0.0
        return Turn(text=text, ids=produced, finish=finish, prompt_tokens=len(ids), dropped=dropped, seconds=seconds)


class _Pieces:
    """Tokens as text, piece by piece, never half a character (a multi-byte character's bytes may span tokens)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.tokens, self.sent = tokenizer, [], 0

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special=True)
        end = len(text.rstrip("\ufffd"))
        piece, self.sent = (text[self.sent:end], end) if end > self.sent else ("", self.sent)
        return piece

    def finish(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special=True)
        piece, self.sent = text[self.sent:], len(text)
        return piece


__all__ = ["END_OF_TURN", "Chat", "Turn", "chat_ids", "stop_ids", "template_for"]
