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

import contextvars
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from functools import wraps
from types import BuiltinFunctionType, BuiltinMethodType

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, operators, optimizeconst
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from tformer.core.errors import TformerError
from tformer.core.files import described

MAX_SOURCE_BYTES = 64 << 10  # real chat templates are 0.3-10 KiB; the largest (tool-calling ones) near 20 KiB
MAX_OUTPUT_CHARS = 1 << 20
MAX_VALUE_CHARS = 2 << 20  # any one string or list the template builds
MAX_WORK_CHARS = 64 << 20  # everything it builds in one render, outputs and intermediates together
MAX_CALL_DEPTH = 64  # macro recursion: each level costs about six Python frames of the 1000 allowed
MAX_SECONDS = 1.0
MAX_MESSAGES_CHARS = 512 << 10  # the messages' text together: the rendered prompt must fit the output cap
MAX_EXTRA_DEPTH = 16  # nesting of the extra keys a message carries (tool calls and their arguments)
MAX_STRFTIME_FORMAT = 256
MAX_ROUND_DIGITS = 1000
MAX_INDENT = 64  # tojson's: each line of a deep dump repeats it once per level
_MAX_BITS = 1 << 18  # of a number built by * or ** (str() refuses past 4300 digits anyway)

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


class _Refused(Exception):
    """A bound the template ran into. Not a ValueError: jinja's filters catch those and carry on."""


class _Raised(TemplateError):
    """raise_exception(msg) from the template: the template's own refusal of the messages."""


# --------------------------------------------------------------------------------------------------
# The budget of one render: a context variable, so concurrent renders in threads or
# tasks each see their own, and the template has no handle on it.

class _Budget:
    __slots__ = ("deadline", "depth", "seconds", "work")

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.work = 0
        self.depth = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Refused(f"ran past its {self.seconds:g} s limit (an endless or huge loop?); stopped")

    def built(self, n: int) -> None:
        if n > MAX_VALUE_CHARS:
            raise _Refused(f"makes a value of {n:,} characters or items, over the {MAX_VALUE_CHARS:,} limit")
        self.work += n
        if self.work > MAX_WORK_CHARS:
            raise _Refused(f"makes over {MAX_WORK_CHARS:,} characters in all (a loop building text?); stopped")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("tformer_chat_template_budget",
                                                                         default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        # Outside a render: jinja folds constant expressions at compile time by calling filters; refusing
        # here leaves them to run at render time, under the budget.
        raise nodes.Impossible()
    return budget


# --------------------------------------------------------------------------------------------------
# Sizes, estimated before a value is printed or built.

_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def _weight(value, limit: int = MAX_VALUE_CHARS) -> int:
    """About how many characters str() of ``value`` prints, counted only until it passes ``limit`` (so a
    list of a million references to one big string costs a few steps, not its printed size)."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v) + 2
        elif isinstance(v, (list, tuple, set, frozenset, *_VIEWS)):
            total += 2 + 2 * len(v)
            if total <= limit:
                stack.extend(v)
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            if total <= limit:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, Namespace):
            total += 16
            stack.append(v._Namespace__attrs)  # its repr prints them
        elif isinstance(v, range):
            total += 8 * len(v)
        elif isinstance(v, bool):
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        else:
            total += 24  # floats, None, Undefined, macros, loop objects: short reprs
    return total


def _size(value) -> int:
    """len() where it is cheap and means memory (strings, lists, dicts), else 0."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value)
    return 0


_DIGIT_RUN = re.compile(r"\d+")
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")


def _check_format(fmt: str, args: Iterable, width_from_args: bool, where: str) -> None:
    """Refuses a %- or {}-format of ``fmt`` that could print past the value cap. Its widths and precisions
    are among the digit runs in it, so their sum bounds them; ``*`` and nested ``{}`` widths come from the
    arguments."""
    total = len(fmt)
    for run in _DIGIT_RUN.findall(fmt):
        if len(run) > 7:
            raise _Refused(f"formats with the width {run[:20]}{'...' if len(run) > 20 else ''} in {where}")
        total += int(run)
    for a in args:
        total += _weight(a)
        if width_from_args and isinstance(a, int) and not isinstance(a, bool):
            total += abs(a)
    if total > MAX_VALUE_CHARS:
        raise _Refused(f"would format about {total:,} characters with {where}, over the {MAX_VALUE_CHARS:,} "
                       f"limit")


def _items(value) -> list:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _check_numbers(where: str, args: tuple, kwargs: dict, limit: int = MAX_VALUE_CHARS) -> None:
    # A filter's widths and counts (center, indent, truncate, wordwrap, batch, slice): one past the value cap
    # can only build something past it. round's precision is a power of ten Python computes in full.
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > limit:
            raise _Refused(f"passed the number {described(a)} to {where}, over the {limit:,} limit")


def _estimate_method(obj, args: tuple, kwargs: dict) -> int:
    """Characters a str/bytes method call may build, for the methods whose result can outgrow its inputs."""
    receiver = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    arg0 = args[0] if args else kwargs.get("length")
    if name == "to_bytes" and isinstance(receiver, int):
        return arg0 if isinstance(arg0, int) else 1
    if not isinstance(receiver, (str, bytes)):
        return 0
    n = len(receiver)
    if name in ("ljust", "rjust", "center", "zfill") and isinstance(arg0, int):
        return max(n, arg0)
    if name == "expandtabs":
        tab = arg0 if isinstance(arg0, int) else kwargs.get("tabsize", 8)
        tab = tab if isinstance(tab, int) else 8
        return n + receiver.count("\t" if isinstance(receiver, str) else b"\t") * max(tab, 0)
    if name == "replace" and len(args) >= 2 and type(args[0]) is type(receiver) is type(args[1]):
        old, new = args[0], args[1]
        count = receiver.count(old) if old else n + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            count = min(count, args[2])
        return n + count * max(len(new) - len(old), 0)
    if name == "join" and isinstance(arg0, (list, tuple)):
        return sum(_size(x) for x in arg0) + n * len(arg0)
    if name == "translate" and isinstance(arg0, dict):
        longest = max((_size(v) for v in arg0.values()), default=1)
        return n * max(longest, 1)
    return 0


# --------------------------------------------------------------------------------------------------
# Filters: every filter runs under the budget; the ones that can build more than they are given are
# estimated first.

def _estimate_filter(name: str, args: tuple, kwargs: dict) -> int:
    value = args[0] if args else None
    rest = args[1:]
    if name == "tojson":
        indent = rest[1] if len(rest) > 1 else kwargs.get("indent")
        if len(indent if isinstance(indent, str) else " " * (indent if isinstance(indent, int) else 0)) > MAX_INDENT:
            raise _Refused(f"passed tojson an indent of {described(indent)}, over {MAX_INDENT} characters")
        return _weight(value)
    if name in ("string", "xmlattr", "escape", "e", "forceescape", "sort", "unique", "dictsort", "groupby", "min",
                "max"):  # printed, or compared item against item in C
        return _weight(value) * (6 if name in ("escape", "e", "forceescape") else 1)
    if name == "format":
        fmt = value if isinstance(value, str) else ""
        _check_format(fmt, (value if fmt == "" else "", *rest, *kwargs.values()), "*" in fmt, "the format filter")
        return 0
    if not isinstance(value, str):
        return _weight(value) if name in ("center", "indent", "wordwrap", "replace", "truncate") else 0
    n = len(value)
    if name == "replace" and len(rest) >= 2:
        if not (isinstance(rest[0], str) and isinstance(rest[1], str)):
            return (n + 1) * (_weight(rest[1]) + 1)  # str() of either could itself be big; assume the worst
        old, new = rest[0], rest[1]
        count = value.count(old) if old else n + 1
        if len(rest) > 2 and isinstance(rest[2], int) and rest[2] >= 0:
            count = min(count, rest[2])
        return n + count * max(len(new) - len(old), 0)
    if name == "indent":
        width = rest[0] if rest else kwargs.get("width", 4)
        per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 4
        return n + (value.count("\n") + 1) * max(per_line, 0)
    if name == "wordwrap":
        width = rest[0] if rest else kwargs.get("width", 79)
        wrap = rest[2] if len(rest) > 2 else kwargs.get("wrapstring")
        lines = n // max(width if isinstance(width, int) else 1, 1) + value.count("\n") + 1
        return n + lines * len(wrap if isinstance(wrap, str) else "\n")
    if name == "center":
        width = rest[0] if rest else kwargs.get("width", 80)
        return max(n, width if isinstance(width, int) else 0)
    return 0


class _GuardedIterator:
    """Iterates for the template, checking the deadline at every item and the size of all items together
    (a lazy ``map`` of big strings joined or listed is stopped before it is all in memory)."""

    __slots__ = ("_budget", "_it", "_seen", "_weigh", "_where")

    def __init__(self, iterable, budget: _Budget, where: str, weigh: bool = False):
        self._it = iter(iterable)
        self._budget = budget
        self._seen = 0
        self._where = where
        self._weigh = weigh  # a for loop only reads its items; a join or sum builds from them

    def __iter__(self):
        return self

    def __next__(self):
        self._budget.tick()
        item = next(self._it)
        if not self._weigh:
            return item
        self._seen += _weight(item, MAX_VALUE_CHARS - self._seen)
        if self._seen > MAX_VALUE_CHARS:
            raise _Refused(f"fed over {MAX_VALUE_CHARS:,} characters of items to {self._where}")
        return item


def _guard_filter(name: str, func):
    passes_context = getattr(func, "jinja_pass_arg", None) is not None

    @wraps(func)  # keeps jinja's pass_context / pass_eval_context / pass_environment marks
    def guarded(*args, **kwargs):
        budget = _budget()
        budget.tick()
        where = f"the {name} filter"
        head, args = (args[:1], args[1:]) if passes_context else ((), args)
        if not args:
            return func(*head, *args, **kwargs)
        # the value may be any size (a number from the messages); the parameters after it are widths and counts
        _check_numbers(where, args[1:], kwargs, limit=MAX_ROUND_DIGITS if name == "round" else MAX_VALUE_CHARS)
        args = tuple(_GuardedIterator(a, budget, where) if isinstance(a, Iterator) else a for a in args)
        if name == "join":
            # materialized under the guard: the estimate needs the items, and join would hold them all anyway
            items = list(_GuardedIterator(args[0], budget, where, weigh=True))
            sep = args[1] if len(args) > 1 else kwargs.get("d", "")
            estimate = _weight(items) + len(sep) * len(items) if isinstance(sep, str) else _weight(items)
            args = (items, *args[1:])
        elif name == "sum":
            # sum adds lists or strings one by one, each copy longer than the last: a tick per item
            estimate = 0
            args = (_GuardedIterator(args[0], budget, where, weigh=True), *args[1:])
        else:
            estimate = _estimate_filter(name, args, kwargs)
        if estimate > MAX_VALUE_CHARS:
            raise _Refused(f"would build about {estimate:,} characters with {where}, over the "
                           f"{MAX_VALUE_CHARS:,} limit")
        result = func(*head, *args, **kwargs)
        budget.built(_size(result))
        return result
    return guarded


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson (json.dumps, no HTML escaping, its options exposed), written through the
    # encoder's chunks so an indented dump of something deep stops at the value cap instead of finishing.
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                               sort_keys=sort_keys)
    if indent is None:
        return encoder.encode(x)  # about its weight, checked before the call
    budget = _budget()
    parts, n = [], 0
    for chunk in encoder.iterencode(x):
        n += len(chunk)
        if n > MAX_VALUE_CHARS:
            raise _Refused(f"built JSON over {MAX_VALUE_CHARS:,} characters with the tojson filter")
        budget.tick()
        parts.append(chunk)
    return "".join(parts)


def _raise_exception(message):
    raise _Raised(str(message))


def _strftime_now(fmt):
    if not isinstance(fmt, str) or len(fmt) > MAX_STRFTIME_FORMAT:
        raise _Refused(f"passed strftime_now a format that is not a string of at most {MAX_STRFTIME_FORMAT} "
                       f"characters ({described(fmt)})")
    return datetime.now().strftime(fmt)


def _dict(*args, **kwargs):
    # The builtin type would hand the template a class (dict.mro(), dict.fromkeys); a function hands it data.
    return dict(*args, **kwargs)


class _Namespace(Namespace):
    """jinja's namespace, refusing underscore names: the template never writes what looks like internals."""

    def __init__(*args, **kwargs):  # jinja's own signature trick: `self` may be a keyword of the namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if not isinstance(name, str) or name.startswith("_"):
            raise SecurityError(f"namespace attribute {described(name)} is not a name without a leading underscore")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it): its body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


# --------------------------------------------------------------------------------------------------
# The compiled template reports to the environment at every output, concatenation and loop iteration.

class _GuardedCodeGenerator(CodeGenerator):
    def visit_Template(self, node, frame=None):
        # jinja allows no new node types, so the loops' iterables are marked by identity
        self._loop_iterables = {id(loop.iter) for loop in node.find_all(nodes.For)}
        super().visit_Template(node, frame)

    def visit(self, node, *args, **kwargs):
        if id(node) not in getattr(self, "_loop_iterables", ()):
            return super().visit(node, *args, **kwargs)
        self.write("environment.tf_iter(")
        super().visit(node, *args, **kwargs)
        self.write(")")

    def _output_child_pre(self, node, frame, finalize):
        super()._output_child_pre(node, frame, finalize)
        self.write("environment.tf_emit(")

    def _output_child_post(self, node, frame, finalize):
        self.write(")")
        super()._output_child_post(node, frame, finalize)

    def _output_const_repr(self, group):
        return f"environment.tf_emit({super()._output_const_repr(group)})"

    @optimizeconst
    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        # == and `in` on lists run in C, element by element: each operand is weighed first
        self.write("(environment.tf_operand(")
        self.visit(node.expr, frame)
        self.write(")")
        for op in node.ops:
            self.write(f" {operators[op.op]} environment.tf_operand(")
            self.visit(op.expr, frame)
            self.write(")")
        self.write(")")

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.tf_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _GuardedCodeGenerator
    # Intercepted, so they are also never folded at compile time: `{{ 'x' * 10**9 }}` would be built there.
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def tf_iter(self, iterable):
        return _GuardedIterator(iterable, _budget(), "a for loop")

    def tf_emit(self, value):
        budget = _budget()
        budget.tick()
        budget.built(_weight(value) if not isinstance(value, str) else len(value))
        return value

    def tf_operand(self, value):
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            _budget().tick()
            weight = _weight(value)
            if weight > MAX_VALUE_CHARS:
                raise _Refused(f"compares a value of about {weight:,} characters, over the {MAX_VALUE_CHARS:,} limit")
        return value

    def tf_concat(self, parts):
        budget = _budget()
        budget.tick()
        budget.built(sum(len(p) if isinstance(p, str) else _weight(p) for p in parts))
        return "".join(map(str, parts))

    def call_binop(self, context, operator, left, right):
        budget = _budget()
        budget.tick()
        seqs = (str, bytes, list, tuple)
        if operator == "*":
            seq, n = (left, right) if isinstance(left, seqs) else (right, left)
            if isinstance(seq, seqs) and isinstance(n, int):
                # a list repeated is references, cheap to build, but as big as its items to print or compare
                budget.built((len(seq) if isinstance(seq, (str, bytes)) else _weight(seq)) * max(n, 0))
            elif isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() + right.bit_length() > _MAX_BITS:
                raise _Refused(f"multiplied numbers of {left.bit_length():,} and {right.bit_length():,} bits")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0 \
                    and right * left.bit_length() > _MAX_BITS:
                raise _Refused(f"raised a number to the power {described(right)}, past {_MAX_BITS:,} bits")
        elif operator == "+":
            if isinstance(left, seqs) and isinstance(right, seqs):
                budget.built(len(left) + len(right))
        elif operator == "%" and isinstance(left, (str, bytes)):
            fmt = left if isinstance(left, str) else left.decode("latin-1")
            _check_format(fmt, _items(right), "*" in fmt, "%")
        return super().call_binop(context, operator, left, right)

    def call(self, context, obj, /, *args, **kwargs):  # positional-only: a template may pass context=, obj=
        budget = _budget()
        budget.tick()
        where = f"{getattr(obj, '__name__', type(obj).__name__)}()"
        if isinstance(obj, (BuiltinFunctionType, BuiltinMethodType)):
            args = tuple(_GuardedIterator(a, budget, where, weigh=True) if isinstance(a, Iterator) else a
                         for a in args)
            if getattr(obj, "__name__", "") == "join" and args and isinstance(args[0], _GuardedIterator):
                args = (list(args[0]), *args[1:])
            estimate = _estimate_method(obj, args, kwargs)
            if estimate > MAX_VALUE_CHARS:
                raise _Refused(f"would build about {estimate:,} characters with {where}, over the "
                               f"{MAX_VALUE_CHARS:,} limit")
        budget.depth += 1
        try:
            if budget.depth > MAX_CALL_DEPTH:
                raise _Refused(f"nested calls more than {MAX_CALL_DEPTH} deep (a recursive macro?); stopped")
            result = super().call(context, obj, *args, **kwargs)
        finally:
            budget.depth -= 1
        budget.built(_size(result))
        return result

    def wrap_str_format(self, value):
        formatter = super().wrap_str_format(value)
        if formatter is None:
            return None
        fmt = value.__self__

        @wraps(formatter)
        def bounded(*args, **kwargs):
            values = (*args, *kwargs.values(), *(_items(args[0]) if args and isinstance(args[0], dict) else ()))
            _check_format(fmt, values, _NESTED_FIELD.search(fmt) is not None, f"{value.__name__}()")
            return formatter(*args, **kwargs)
        return bounded

    def unsafe_undefined(self, obj, attribute):
        # jinja returns an Undefined that prints as "" and fails only when used further; refuse at once.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


_DROPPED_FILTERS = ("pprint", "urlize", "striptags")
_DROPPED_GLOBALS = ("lipsum",)


def _environment() -> _GuardedEnvironment:
    # transformers' settings (chat_template_utils._compile_jinja_template): trim_blocks and lstrip_blocks,
    # loop controls, its {% generation %} tag; keep_trailing_newline and autoescape left at their defaults.
    env = _GuardedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[jinja2.ext.loopcontrols, _Generation])
    for name in _DROPPED_FILTERS:
        env.filters.pop(name, None)
    for name in _DROPPED_GLOBALS:
        env.globals.pop(name, None)
    env.filters["tojson"] = _tojson
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_dict,
                       namespace=_Namespace)
    return env


# --------------------------------------------------------------------------------------------------
# Messages

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
