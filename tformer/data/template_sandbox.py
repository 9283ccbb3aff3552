"""The sandbox a chat template renders in (tformer.data.chat_template has what is bounded and why):
jinja2's ImmutableSandboxedEnvironment with a deadline checked at every loop item, call, output and
intercepted operator, a cap on call depth, and estimates of what one C call would build (a repeated string, a
power, a padded format) made before the call runs."""

from __future__ import annotations

import contextvars
import json
import re
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import wraps
from types import BuiltinFunctionType, BuiltinMethodType

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, operators, optimizeconst
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from tformer.core.files import described

MAX_OUTPUT_CHARS = 1 << 20
MAX_VALUE_CHARS = 2 << 20  # any one string or list the template builds
MAX_WORK_CHARS = 64 << 20  # everything it builds in one render, outputs and intermediates together
MAX_CALL_DEPTH = 64  # macro recursion: each level costs about six Python frames of the 1000 allowed
MAX_SECONDS = 1.0
MAX_STRFTIME_FORMAT = 256
MAX_ROUND_DIGITS = 1000
MAX_INDENT = 64  # tojson's: each line of a deep dump repeats it once per level
_MAX_BITS = 1 << 18  # of a number built by * or ** (str() refuses past 4300 digits anyway)


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
