"""Chat templates, rendered safely: a model file's Jinja template turns a list of messages into a prompt.

The template is untrusted input (it comes inside the model file), so it is rendered in jinja2's
``ImmutableSandboxedEnvironment`` with bounds on everything it can spend:

- source: at most ``MAX_SOURCE_BYTES``; a syntax error is one line naming the template line.
- time: a deadline (``max_seconds``, 1 s by default) checked at every loop iteration, every call (macros,
  methods, filters), every output and every intercepted operator, so a huge or endless loop, nested loops
  with or without output, and recursion all stop within a few milliseconds of it; calls nest at most
  ``MAX_CALL_DEPTH`` deep.
- memory: no single value it builds may pass ``MAX_VALUE_CHARS`` and everything it builds together may not
  pass ``MAX_WORK_CHARS``; operations that could build a huge value in one C call (``'x' * n``, ``a ** b``,
  ``'%0999999999d' % 1``, ``s|center(n)``, ``sep.join(xs)``, ``s.replace('', big)``, ``x|string`` of a list
  of references, ``==`` or ``|sort`` on one...) are estimated before they run, so the allocation (or the
  long C loop) never happens.
- output: at most ``max_output_chars``; rendering stops past it.

Every refusal is one ``TformerError`` line that says it came from the model's chat template (and the
template line where known). The rendering matches ``transformers``' ``apply_chat_template`` for the same
template: the same environment settings (``trim_blocks``, ``lstrip_blocks``, loop controls, a
``{% generation %}`` block), the same globals (``raise_exception``, ``strftime_now``, ``namespace``,
``dict``) and the same ``tojson`` filter, the same variables (``messages``, ``add_generation_prompt``,
``tools``, ``documents``, the named special tokens). What a template cannot use here: ``lipsum`` and the
``pprint``, ``urlize`` and ``striptags`` filters (their cost cannot be bounded cheaply; chat templates do
not use them).

``ChatTemplate(source, bos_token=..., eos_token=...).render(messages)`` renders; ``chatml_default(tokens)``
is the ChatML template for a model without one, if its vocabulary has ChatML's tokens;
``chat_template_for(source, tokens, ...)`` picks between the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError

from tformer.core.errors import TformerError
from tformer.core.files import described
from tformer.data.template_sandbox import (
    _BUDGET,
    MAX_OUTPUT_CHARS,
    MAX_SECONDS,
    _Budget,
    _environment,
    _Raised,
    _Refused,
    _weight,
)

MAX_SOURCE_BYTES = 64 << 10  # real chat templates are 0.3-10 KiB; the largest (tool-calling ones) near 20 KiB
MAX_MESSAGES_CHARS = 512 << 10  # the messages' text together: the rendered prompt must fit the output cap
MAX_EXTRA_DEPTH = 16  # nesting of the extra keys a message carries (tool calls and their arguments)

ROLES = ("system", "user", "assistant", "tool")
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_ORIGIN = "the model's chat template"
_NAMED_TOKENS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _one_line(text, limit: int = 200) -> str:
    """Untrusted text shown in an error (a template's own message, jinja's words about it): whitespace runs
    folded to one space, unprintable characters escaped, cut to ``limit``."""
    folded = " ".join(str(text).split())
    shown = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in folded[:limit])
    return shown + ("..." if len(folded) > limit else "")


def _plain(value, where: str, depth: int = 0):
    """A message's extra value as plain JSON data (what a template may read: tool calls, names, ids)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth >= MAX_EXTRA_DEPTH:
        raise TformerError(f"{where} nests deeper than {MAX_EXTRA_DEPTH} levels; flatten it")
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TformerError(f"{where} has a key {described(k)} that is not a string; keys are strings")
            out[k] = _plain(v, where, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, where, depth + 1) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise TformerError(f"{where} is of type {type(value).__name__}; messages carry strings, numbers, booleans, "
                       f"null, lists and objects")


def _content(value, where: str) -> str:
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (list, tuple)):
        texts = []
        for j, part in enumerate(value):
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise TformerError(f"{where} part {j} is {described(part)}; a content part is "
                                   f'{{"type": "text", "text": "..."}}')
            texts.append(str.__str__(part["text"]))
        # Text parts joined by newlines, as vLLM flattens OpenAI multi-part content for string templates.
        return "\n".join(texts)
    raise TformerError(f"{where} content is {described(value)}; content is a string or a list of "
                       f'{{"type": "text", "text": "..."}} parts')


def validate_messages(messages) -> list[dict]:
    """``messages`` checked and copied as the template will see them: dicts with a ``role`` in ROLES and a
    string ``content`` (text parts joined), other keys kept as plain JSON data, None-valued keys dropped (as
    transformers does), the text together at most MAX_MESSAGES_CHARS. Anything else is one TformerError."""
    if not isinstance(messages, (list, tuple)):
        raise TformerError(f"messages is {described(messages)}; messages are a list of "
                           f'{{"role": ..., "content": ...}} objects')
    if not messages:
        raise TformerError("messages is an empty list; a chat needs at least one message")
    out, total = [], 0
    for i, message in enumerate(messages):
        where = f"message {i}"
        if not isinstance(message, Mapping):
            raise TformerError(f"{where} is {described(message)}; a message is a "
                               f'{{"role": ..., "content": ...}} object')
        role = message.get("role")
        if role is None:
            raise TformerError(f"{where} has no role; a role is one of {', '.join(ROLES)}")
        if role not in ROLES:
            raise TformerError(f"{where} has role {described(role)}; a role is one of {', '.join(ROLES)}")
        checked = {}
        for key, value in message.items():
            if not isinstance(key, str):
                raise TformerError(f"{where} has a key {described(key)} that is not a string; keys are strings")
            if value is None or key in ("role", "content"):
                continue
            checked[key] = _plain(value, f"{where} {key}")
        content = message.get("content")
        if content is not None:
            checked["content"] = _content(content, where)
        elif not (role == "assistant" and checked.get("tool_calls")):
            raise TformerError(f"{where} has no content; content is a string (an assistant message may "
                               f"leave it out when it carries tool_calls)")
        checked = {"role": role, **checked}
        total += _weight(checked, MAX_MESSAGES_CHARS * 2)
        if total > MAX_MESSAGES_CHARS:
            raise TformerError(f"messages hold over {MAX_MESSAGES_CHARS:,} characters (at message {i}); "
                               f"shorten the conversation")
        out.append(checked)
    return out


# --------------------------------------------------------------------------------------------------

def _template_line(exc: BaseException) -> int | None:
    """The template line an error was raised at: jinja rewrites tracebacks so template frames carry the
    template's own line numbers under the file name <template>."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _at(line: int | None) -> str:
    return f" at line {line}" if line else ""


class ChatTemplate:
    """A chat template from a model file, compiled once and rendered under bounds (see the module notes).

    ``source``: the Jinja text (``tokenizer.chat_template`` in GGUF, ``chat_template`` in
    tokenizer_config.json); ``bos_token``/``eos_token`` and any of ``tokens`` (unk_token, pad_token, ...)
    are the variables transformers gives a template beside the messages."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str, tokens: Mapping[str, str] | None = None,
                 max_seconds: float = MAX_SECONDS, max_output_chars: int = MAX_OUTPUT_CHARS):
        if not isinstance(source, str):
            raise TformerError(f"{_ORIGIN} is {described(source)}, not text")
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_SOURCE_BYTES:
            raise TformerError(f"{_ORIGIN} is {size:,} bytes, over the {MAX_SOURCE_BYTES:,}-byte limit; refused")
        variables = {"bos_token": bos_token, "eos_token": eos_token, **(tokens or {})}
        for name, value in variables.items():
            if name not in ("bos_token", "eos_token", *_NAMED_TOKENS) or not isinstance(value, str):
                raise TformerError(f"special token {described(name)} = {described(value)}: the named tokens "
                                   f"are bos_token, eos_token, {', '.join(_NAMED_TOKENS)}, each a string")
        if not (0 < max_seconds <= 60) or not (0 < max_output_chars <= 16 * MAX_OUTPUT_CHARS):
            raise TformerError(f"max_seconds {max_seconds} / max_output_chars {max_output_chars}: the limits are "
                               f"(0, 60] s and (0, {16 * MAX_OUTPUT_CHARS:,}] characters")
        self.source = source
        self.tokens = variables
        self.max_seconds = max_seconds
        self.max_output_chars = max_output_chars
        env = _environment()
        token = _BUDGET.set(None)  # compile-time folding must not run guarded code under a caller's budget
        try:
            self._template = env.from_string(source)
        except TemplateSyntaxError as e:
            raise TformerError(f"{_ORIGIN} has a syntax error{_at(e.lineno)}: {_one_line(e.message or e)}; "
                               f"the model file's template is broken") from None
        except RecursionError:
            raise TformerError(f"{_ORIGIN} nests too deeply to compile; refused") from None
        except Exception as e:  # the compiler's own limits: literals past Python's, code nesting past its parser
            raise TformerError(f"{_ORIGIN} does not compile: {type(e).__name__}: {_one_line(e)}") from None
        finally:
            _BUDGET.reset(token)

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (see validate_messages), ending with the assistant's header when
        ``add_generation_prompt``; one TformerError line for bad messages or a template that misbehaves."""
        checked = validate_messages(messages)
        variables = {**self.tokens, "messages": checked, "tools": None, "documents": None,
                     "add_generation_prompt": bool(add_generation_prompt)}
        budget = _Budget(self.max_seconds)
        token = _BUDGET.set(budget)
        parts, n = [], 0
        stream = self._template.generate(variables)
        try:
            for chunk in stream:
                n += len(chunk)
                if n > self.max_output_chars:
                    raise _Refused(f"rendered over {self.max_output_chars:,} characters; stopped")
                budget.tick()
                parts.append(chunk)
        except _Refused as e:
            raise TformerError(f"{_ORIGIN} {e}{_at(_template_line(e))}") from None
        except _Raised as e:
            raise TformerError(f"{_ORIGIN} refused the messages{_at(_template_line(e))}: {_one_line(e)}") from None
        except SecurityError as e:
            raise TformerError(f"{_ORIGIN} reaches outside its sandbox{_at(_template_line(e))} "
                               f"({_one_line(e)}); refused") from None
        except RecursionError:
            raise TformerError(f"{_ORIGIN} recursed too deeply (a recursive macro?); stopped") from None
        except MemoryError:
            raise TformerError(f"{_ORIGIN} ran out of memory; stopped") from None
        except UndefinedError as e:
            raise TformerError(f"{_ORIGIN} failed{_at(_template_line(e))}: {_one_line(e)}") from None
        except Exception as e:  # anything a template can trip over: TypeError, ZeroDivisionError, ...
            raise TformerError(f"{_ORIGIN} failed{_at(_template_line(e))}: {type(e).__name__}: "
                               f"{_one_line(e)}") from None
        finally:
            stream.close()
            _BUDGET.reset(token)
        return "".join(parts)

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source):,} characters)"


def chatml_default(special_tokens: Iterable[str]) -> str:
    """The ChatML template for a model whose file has no chat template, if its vocabulary has ChatML's
    ``<|im_start|>`` and ``<|im_end|>`` as special tokens (a model trained on ChatML has them); otherwise
    the model has no way to mark turns and this is one TformerError."""
    have = set(special_tokens)
    missing = [t for t in CHATML_TOKENS if t not in have]
    if missing:
        raise TformerError(f"the model has no chat template, and its vocabulary lacks {' and '.join(missing)} "
                           f"for a ChatML default; use plain text generation or a model with a chat template")
    return CHATML_TEMPLATE


def chat_template_for(source: str | None, special_tokens: Iterable[str], *, bos_token: str, eos_token: str,
                      **kwargs) -> ChatTemplate:
    """The model's own template, or ChatML (chatml_default) when it has none (``source`` None or empty)."""
    if source is None or (isinstance(source, str) and not source.strip()):
        source = chatml_default(special_tokens)
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token, **kwargs)
