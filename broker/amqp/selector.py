"""JMS message selectors (``x-filter-jms-selector``) over AMQP 0-9-1 messages.

A consumer may pass a JMS 1.1 / SQL-92 style selector in its ``basic.consume``
arguments, as Apache Qpid's broker supports; only messages for which the
selector is TRUE are delivered to it.  This module compiles the selector text
once, into a tree of Python closures (no per-message interpretation of an
AST), and evaluates it against the raw content-header frame payload.

Evaluation follows SQL's three-valued logic: values are ``True``, ``False`` or
``None`` (UNKNOWN / NULL).  A missing identifier is NULL; comparisons and
arithmetic involving NULL, or values of incompatible types, are UNKNOWN; a
message matches only when the whole selector is TRUE.

Decoding is lazy: compilation records which identifiers the selector uses, so
``Selector.matches`` decodes only the basic properties it needs, stops after
the last of them, and in the ``headers`` table decodes only the values of the
keys it needs (the others are skipped by their encoded length).

One concept in one module, over the usual length: the lexer, the parser and
the compiler of one small language share its grammar, its value rules and
the lazy property decoder, and read best side by side.
"""

from __future__ import annotations

import operator
import re
import struct
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Final, NamedTuple, NoReturn

from pamqp import decode

__all__ = ["Selector", "SelectorError", "compile_selector"]

# A compiled expression: takes the values of the selector's identifiers, by
# slot number, and returns a value (True/False/None for predicates).
_Eval = Callable[[list[Any]], Any]


class _Opaque:
    """A value that is present but has no JMS type (a timestamp, a nested
    table or array, undecodable text): it is not NULL, yet every comparison
    with it is UNKNOWN, because each operator checks its operands' types."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<opaque>"


_OPAQUE: Final = _Opaque()

# Error messages quote at most this much of the selector and of a token, so
# that str(SelectorError) stays short enough for a channel.close reply-text.
_SHOWN_TEXT = 60
_SHOWN_TOKEN = 20

# Parentheses / NOT / sign nesting, and call depth of the compiled closures:
# far beyond any real selector, well within Python's recursion limit.
_MAX_NESTING = 50
_MAX_DEPTH = 200


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SelectorError(ValueError):
    """The selector text is not a valid selector.

    ``position`` is the 0-based offset in ``text`` where it goes wrong (the
    length of the text for an unexpected end)."""

    def __init__(self, text: str, position: int, reason: str) -> None:
        # All three go into args so that the exception survives pickling
        # (errors may cross the broker's process boundaries).
        super().__init__(text, position, reason)
        self.text = text
        self.position = position
        self.reason = reason

    def __str__(self) -> str:
        shown = _clip(self.text, _SHOWN_TEXT)
        return f"invalid selector {shown!r}: {self.reason} at position {self.position}"


# --------------------------------------------------------------------------
# Tokenizer

_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE"}
)
_COMPARISONS: Final = frozenset({"=", "<>", "<", ">", "<=", ">="})

# Qpid's (ActiveMQ's) literal grammar: hex, decimal-with-exponent forms, and
# integers (a leading 0 makes an octal literal there, so it does here).
_NUMBER_RE: Final = re.compile(
    r"0[xX][0-9a-fA-F]+[lL]?"
    r"|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+"
    r"|[0-9]+[lL]?"
)


class _Token(NamedTuple):
    kind: str  # "num", "str", "ident", "kw", "op" or "end"
    value: Any  # the literal's value, the keyword upper-cased, the operator
    pos: int
    end: int


def _is_ident_start(c: str) -> bool:
    return c.isalpha() or c == "_" or c == "$"


def _is_ident_part(c: str) -> bool:
    return c.isalnum() or c == "_" or c == "$"


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == "'":
            # '' inside a string is one quote (SQL); no other escapes exist.
            parts: list[str] = []
            j = i + 1
            while True:
                k = text.find("'", j)
                if k < 0:
                    raise SelectorError(text, i, "unterminated string literal")
                parts.append(text[j:k])
                if k + 1 < n and text[k + 1] == "'":
                    parts.append("'")
                    j = k + 2
                else:
                    break
            tokens.append(_Token("str", "".join(parts), i, k + 1))
            i = k + 1
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            tokens.append(_number(text, i))
            i = tokens[-1].end
        elif _is_ident_start(c):
            j = i + 1
            while j < n and _is_ident_part(text[j]):
                j += 1
            word = text[i:j]
            upper = word.upper()
            if upper in _KEYWORDS:
                tokens.append(_Token("kw", upper, i, j))
            else:
                tokens.append(_Token("ident", word, i, j))
            i = j
        elif text.startswith(("<>", "<=", ">="), i):
            tokens.append(_Token("op", text[i : i + 2], i, i + 2))
            i += 2
        elif c in "=<>+-*/(),":
            tokens.append(_Token("op", c, i, i + 1))
            i += 1
        else:
            raise SelectorError(text, i, f"unexpected character {c!r}")
    tokens.append(_Token("end", None, n, n))
    return tokens


def _number(text: str, start: int) -> _Token:
    m = _NUMBER_RE.match(text, start)
    end = m.end() if m else start
    # "12abc", "1e", "0x", "1.2.3": a number must not run into a name or dot.
    if m is None or (end < len(text) and (_is_ident_part(text[end]) or text[end] == ".")):
        stop = end
        while stop < len(text) and (_is_ident_part(text[stop]) or text[stop] == "."):
            stop += 1
        bad = _clip(text[start:stop], _SHOWN_TOKEN)
        raise SelectorError(text, start, f"malformed number {bad!r}")
    raw = m.group()
    value: int | float
    if raw[:2] in ("0x", "0X"):
        value = int(raw.rstrip("lL")[2:], 16)
    elif "." in raw or "e" in raw or "E" in raw:
        value = float(raw)
    else:
        digits = raw.rstrip("lL")
        if len(digits) > 1 and digits[0] == "0":
            if not all(d in "01234567" for d in digits):
                raise SelectorError(text, start, f"malformed octal number {raw!r}")
            value = int(digits, 8)
        else:
            value = int(digits)
    return _Token("num", value, start, end)


# --------------------------------------------------------------------------
# Compiled nodes

# Static kinds, used to reject selectors that can never be boolean (Qpid does
# the same): a literal's kind is known; an identifier or NULL can be anything.
_BOOL = "boolean"
_NUM = "numeric"
_STR = "string"
_ANY = "any"


class _NoConst:
    __slots__ = ()


_NOT_CONST: Final = _NoConst()


class _Node:
    __slots__ = ("const", "depth", "fn", "kind", "pos", "slot")

    def __init__(
        self,
        fn: _Eval,
        kind: str,
        pos: int,
        const: Any = _NOT_CONST,
        slot: int | None = None,
    ) -> None:
        self.fn = fn
        self.kind = kind
        self.pos = pos
        self.const = const  # the value when known at compile time
        self.slot = slot  # the identifier's slot when the node is one
        self.depth = 1  # how deeply evaluating it nests Python calls

    @property
    def is_const(self) -> bool:
        return self.const is not _NOT_CONST


def _const(value: Any, kind: str, pos: int) -> _Node:
    def fn(env: list[Any]) -> Any:
        return value

    return _Node(fn, kind, pos, const=value)


def _slot_node(slot: int, pos: int) -> _Node:
    def fn(env: list[Any]) -> Any:
        return env[slot]

    return _Node(fn, _ANY, pos, slot=slot)


def _is_num(v: Any) -> bool:
    t = type(v)
    return t is int or t is float  # bool is not a number in JMS


def _as_truth(v: Any) -> bool | None:
    return v if v is True or v is False else None


# Comparison of two runtime values; JMS allows only = and <> between strings
# and between booleans, and nothing between different types.
_CMP_OPS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}
_FLIPPED: Final = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _compare_values(op: str, a: Any, b: Any) -> bool | None:
    ta = type(a)
    tb = type(b)
    if (ta is int or ta is float) and (tb is int or tb is float):
        return _CMP_OPS[op](a, b)
    if (op == "=" or op == "<>") and ta is tb and (ta is str or ta is bool):
        return _CMP_OPS[op](a, b)
    return None


def _compare(op: str, left: _Node, right: _Node) -> _Node:
    if left.is_const and right.is_const:
        return _const(_compare_values(op, left.const, right.const), _BOOL, left.pos)
    if left.is_const:  # "5 < x" is "x > 5": put the literal on the right
        left, right, op = right, left, _FLIPPED[op]
    cmp = _CMP_OPS[op]
    equality = op == "=" or op == "<>"
    if right.is_const:
        # Specialise on the literal's type: one type test per message.
        c = right.const
        lf = left.fn
        slot = left.slot
        if _is_num(c):
            if slot is not None:

                def num_slot(env: list[Any]) -> bool | None:
                    v = env[slot]
                    t = type(v)
                    return cmp(v, c) if t is int or t is float else None

                return _Node(num_slot, _BOOL, left.pos)

            def num_expr(env: list[Any]) -> bool | None:
                v = lf(env)
                t = type(v)
                return cmp(v, c) if t is int or t is float else None

            return _Node(num_expr, _BOOL, left.pos)
        if equality and (type(c) is str or type(c) is bool):
            ct = type(c)
            if slot is not None:

                def eq_slot(env: list[Any]) -> bool | None:
                    v = env[slot]
                    return cmp(v, c) if type(v) is ct else None

                return _Node(eq_slot, _BOOL, left.pos)

            def eq_expr(env: list[Any]) -> bool | None:
                v = lf(env)
                return cmp(v, c) if type(v) is ct else None

            return _Node(eq_expr, _BOOL, left.pos)
        # NULL, or a string/boolean literal under <, >, <=, >=: always UNKNOWN.
        return _const(None, _BOOL, left.pos)
    lf, rf = left.fn, right.fn

    def generic(env: list[Any]) -> bool | None:
        return _compare_values(op, lf(env), rf(env))

    return _Node(generic, _BOOL, left.pos)


_ARITH_OPS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    # Qpid (like ActiveMQ) divides as doubles: 7 / 2 = 3.5.
    "/": operator.truediv,
}


def _arith_values(fn: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if (ta is int or ta is float) and (tb is int or tb is float):
        try:
            return fn(a, b)
        except ArithmeticError:  # division by zero, int too large for a float
            return None
    return None


def _arith(op: str, left: _Node, right: _Node) -> _Node:
    fn = _ARITH_OPS[op]
    if left.is_const and right.is_const:
        return _const(_arith_values(fn, left.const, right.const), _NUM, left.pos)
    lf, rf = left.fn, right.fn

    def arith(env: list[Any]) -> Any:
        return _arith_values(fn, lf(env), rf(env))

    return _Node(arith, _NUM, left.pos)


def _negate_value(v: Any) -> Any:
    return -v if _is_num(v) else None


def _unary(op: str, operand: _Node, pos: int) -> _Node:
    if op == "-":
        if operand.is_const:
            return _const(_negate_value(operand.const), _NUM, pos)
        f = operand.fn

        def neg(env: list[Any]) -> Any:
            return _negate_value(f(env))

        return _Node(neg, _NUM, pos)
    if operand.is_const:
        c = operand.const
        return _const(c if _is_num(c) else None, _NUM, pos)
    f = operand.fn

    def plus(env: list[Any]) -> Any:
        v = f(env)
        return v if _is_num(v) else None

    return _Node(plus, _NUM, pos)


def _not(operand: _Node) -> _Node:
    if operand.is_const:
        c = operand.const
        return _const(None if c is None else not c, _BOOL, operand.pos)
    f = operand.fn

    def not_(env: list[Any]) -> bool | None:
        v = f(env)
        return None if v is None else not v

    return _Node(not_, _BOOL, operand.pos)


def _logic(is_and: bool, operands: list[_Node]) -> _Node:
    # SQL truth tables: FALSE dominates AND, TRUE dominates OR, and otherwise
    # any UNKNOWN operand makes the result UNKNOWN.
    stop = not is_and  # the value that decides the result on its own
    pos = operands[0].pos
    live: list[_Node] = []
    unknown = False
    for node in operands:
        if node.is_const:
            if node.const is stop:
                return _const(stop, _BOOL, pos)
            if node.const is None:
                unknown = True
            continue  # a constant non-deciding operand changes nothing else
        live.append(node)
    if not live:
        return _const(None if unknown else is_and, _BOOL, pos)
    if unknown:
        live.append(_const(None, _BOOL, pos))
    if len(live) == 1:
        return live[0]
    if len(live) == 2:
        a, b = live[0].fn, live[1].fn
        if is_and:

            def and2(env: list[Any]) -> bool | None:
                x = a(env)
                if x is False:
                    return False
                y = b(env)
                if y is False:
                    return False
                return True if x is True and y is True else None

            return _Node(and2, _BOOL, pos)

        def or2(env: list[Any]) -> bool | None:
            x = a(env)
            if x is True:
                return True
            y = b(env)
            if y is True:
                return True
            return False if x is False and y is False else None

        return _Node(or2, _BOOL, pos)
    fns = tuple(node.fn for node in live)
    done = stop
    rest = not stop

    def logic_n(env: list[Any]) -> bool | None:
        result: bool | None = rest
        for f in fns:
            v = f(env)
            if v is done:
                return done
            if v is None:
                result = None
        return result

    return _Node(logic_n, _BOOL, pos)


def _between(subject: _Node, low: _Node, high: _Node, negate: bool) -> _Node:
    sf, lf, hf = subject.fn, low.fn, high.fn

    def between(env: list[Any]) -> bool | None:
        v = sf(env)
        lo = lf(env)
        hi = hf(env)
        if _is_num(v) and _is_num(lo) and _is_num(hi):
            return (lo <= v <= hi) is not negate
        # Spelled out as "lo <= v AND v <= hi": one side may still be FALSE
        # while the other is UNKNOWN (5 BETWEEN 10 AND NULL is FALSE).
        a = _compare_values("<=", lo, v)
        b = _compare_values("<=", v, hi)
        if a is False or b is False:
            return negate
        if a is None or b is None:
            return None
        return not negate

    if subject.is_const and low.is_const and high.is_const:
        return _const(between([]), _BOOL, subject.pos)
    return _Node(between, _BOOL, subject.pos)


def _in_list(subject: _Node, items: frozenset[str], negate: bool) -> _Node:
    sf = subject.fn

    def in_(env: list[Any]) -> bool | None:
        v = sf(env)
        if type(v) is not str:
            return None
        return (v in items) is not negate

    if subject.is_const:
        return _const(in_([]), _BOOL, subject.pos)
    return _Node(in_, _BOOL, subject.pos)


def _like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool] | None:
    """Build a str -> bool matcher for a LIKE pattern; None if the pattern
    ends with a lone escape character."""
    # Pieces: literal text, "%" (any run) or "_" (any one character).
    pieces: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape:
            i += 1
            if i == len(pattern):
                return None
            pieces.append(("lit", pattern[i]))
        elif c == "%":
            if not pieces or pieces[-1][0] != "%":
                pieces.append(("%", ""))
        elif c == "_":
            pieces.append(("_", ""))
        else:
            pieces.append(("lit", c))
        i += 1
    merged: list[tuple[str, str]] = []
    for kind, text in pieces:
        if kind == "lit" and merged and merged[-1][0] == "lit":
            merged[-1] = ("lit", merged[-1][1] + text)
        else:
            merged.append((kind, text))
    kinds = tuple(kind for kind, _ in merged)
    texts = [text for _, text in merged]
    # Common shapes avoid the regex engine.
    if kinds == ():
        return lambda s: s == ""
    if kinds == ("lit",):
        lit = texts[0]
        return lambda s: s == lit
    if kinds == ("%",):
        return lambda s: True
    if kinds == ("lit", "%"):
        prefix = texts[0]
        return lambda s: s.startswith(prefix)
    if kinds == ("%", "lit"):
        suffix = texts[1]
        return lambda s: s.endswith(suffix)
    if kinds == ("%", "lit", "%"):
        middle = texts[1]
        return lambda s: middle in s
    # Everything but the wildcards is escaped, so regex metacharacters in the
    # pattern match themselves; DOTALL lets % and _ match newlines too.
    regex = "".join(
        ".*" if kind == "%" else "." if kind == "_" else re.escape(text) for kind, text in merged
    )
    fullmatch = re.compile(regex, re.DOTALL).fullmatch
    return lambda s: fullmatch(s) is not None


def _like(subject: _Node, match: Callable[[str], bool], negate: bool) -> _Node:
    sf = subject.fn

    def like(env: list[Any]) -> bool | None:
        v = sf(env)
        if type(v) is not str:
            return None  # LIKE applies to strings only; anything else is UNKNOWN
        return match(v) is not negate

    if subject.is_const:
        return _const(like([]), _BOOL, subject.pos)
    return _Node(like, _BOOL, subject.pos)


def _is_null(subject: _Node, negate: bool) -> _Node:
    if subject.is_const:
        return _const((subject.const is None) is not negate, _BOOL, subject.pos)
    sf = subject.fn

    def is_null(env: list[Any]) -> bool:
        return (sf(env) is None) is not negate

    return _Node(is_null, _BOOL, subject.pos)


# --------------------------------------------------------------------------
# Parser


#   selector   := or
#   or         := and (OR and)*
#   and        := not (AND not)*
#   not        := NOT not | predicate
#   predicate  := sum [ cmp-op sum
#                     | [NOT] BETWEEN sum AND sum
#                     | [NOT] IN '(' string (',' string)* ')'
#                     | [NOT] LIKE string [ESCAPE string]
#                     | IS [NOT] NULL ]
#   sum        := product (('+' | '-') product)*
#   product    := unary (('*' | '/') unary)*
#   unary      := ('+' | '-') unary | primary
#   primary    := literal | identifier | '(' or ')'
class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.slots: dict[str, int] = {}
        self.level = 0  # parentheses, NOT and unary signs being parsed

    # -- limits: selectors come from clients, so neither parsing nor
    # evaluation may be driven into a RecursionError.

    def enter(self, pos: int) -> None:
        self.level += 1
        if self.level > _MAX_NESTING:
            self.fail(pos, "selector nests too deeply")

    def nest(self, node: _Node, *children: _Node) -> _Node:
        """Record the evaluation depth of ``node``, built from ``children``."""
        if node.is_const or any(node is child for child in children):
            return node
        node.depth = 1 + max(child.depth for child in children)
        if node.depth > _MAX_DEPTH:
            self.fail(node.pos, "selector is too deeply nested to evaluate")
        return node

    # -- helpers

    def fail(self, pos: int, reason: str) -> NoReturn:
        raise SelectorError(self.text, pos, reason)

    def unexpected(self, tok: _Token, expected: str = "") -> NoReturn:
        if tok.kind == "end":
            reason = "unexpected end of selector"
        else:
            reason = f"unexpected {_clip(self.text[tok.pos : tok.end], _SHOWN_TOKEN)!r}"
        if expected:
            reason += f", expected {expected}"
        self.fail(tok.pos, reason)

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def at_kw(self, word: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind == "kw" and tok.value == word

    def at_op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.value in ops

    def expect_kw(self, word: str) -> None:
        if not self.at_kw(word):
            self.unexpected(self.peek(), word)
        self.take()

    def expect_op(self, op: str) -> None:
        if not self.at_op(op):
            self.unexpected(self.peek(), repr(op))
        self.take()

    def boolean(self, node: _Node) -> _Node:
        """Check that ``node`` can be a truth value, and make sure it only
        ever yields True, False or None (an identifier may hold anything)."""
        if node.kind == _NUM or node.kind == _STR:
            self.fail(node.pos, f"expected a boolean expression, found a {node.kind} one")
        if node.kind == _BOOL:
            return node
        if node.is_const:
            return _const(_as_truth(node.const), _BOOL, node.pos)
        slot = node.slot
        if slot is not None:

            def truth_slot(env: list[Any]) -> bool | None:
                v = env[slot]
                return v if v is True or v is False else None

            return _Node(truth_slot, _BOOL, node.pos)
        f = node.fn

        def truth(env: list[Any]) -> bool | None:
            v = f(env)
            return v if v is True or v is False else None

        return self.nest(_Node(truth, _BOOL, node.pos), node)

    def string_literal(self, what: str) -> _Token:
        tok = self.peek()
        if tok.kind == "end":
            self.unexpected(tok, what)
        if tok.kind != "str":
            self.fail(tok.pos, f"{what} must be a string literal")
        return self.take()

    # -- grammar

    def parse(self) -> _Node:
        node = self.or_()
        if self.peek().kind != "end":
            self.unexpected(self.peek())
        return self.boolean(node)

    def or_(self) -> _Node:
        first = self.and_()
        if not self.at_kw("OR"):
            return first
        operands = [self.boolean(first)]
        while self.at_kw("OR"):
            self.take()
            operands.append(self.boolean(self.and_()))
        return self.nest(_logic(False, operands), *operands)

    def and_(self) -> _Node:
        first = self.not_()
        if not self.at_kw("AND"):
            return first
        operands = [self.boolean(first)]
        while self.at_kw("AND"):
            self.take()
            operands.append(self.boolean(self.not_()))
        return self.nest(_logic(True, operands), *operands)

    def not_(self) -> _Node:
        if self.at_kw("NOT"):
            pos = self.take().pos
            self.enter(pos)
            operand = self.boolean(self.not_())
            self.level -= 1
            node = self.nest(_not(operand), operand)
            node.pos = pos
            return node
        return self.predicate()

    def predicate(self) -> _Node:
        left = self.sum_()
        tok = self.peek()
        if tok.kind == "op" and tok.value in _COMPARISONS:
            self.take()
            right = self.sum_()
            return self.nest(_compare(tok.value, left, right), left, right)
        if tok.kind != "kw":
            return left
        negate = False
        if tok.value == "NOT":
            after = self.peek(1)
            if not (after.kind == "kw" and after.value in ("BETWEEN", "LIKE", "IN")):
                self.take()
                self.unexpected(after, "BETWEEN, LIKE or IN after NOT")
            self.take()
            negate = True
            tok = after
        if tok.value == "BETWEEN":
            self.take()
            low = self.sum_()
            self.expect_kw("AND")
            high = self.sum_()
            return self.nest(_between(left, low, high, negate), left, low, high)
        if tok.value == "IN":
            self.take()
            return self.nest(self.in_list(left, negate), left)
        if tok.value == "LIKE":
            self.take()
            return self.nest(self.like(left, negate), left)
        if tok.value == "IS":
            self.take()
            negate = self.at_kw("NOT")
            if negate:
                self.take()
            self.expect_kw("NULL")
            return self.nest(_is_null(left, negate), left)
        return left

    def in_list(self, subject: _Node, negate: bool) -> _Node:
        self.expect_op("(")
        if self.at_op(")"):
            self.fail(self.peek().pos, "IN list must not be empty")
        items = {self.string_literal("IN list item").value}
        while self.at_op(","):
            self.take()
            items.add(self.string_literal("IN list item").value)
        self.expect_op(")")
        return _in_list(subject, frozenset(items), negate)

    def like(self, subject: _Node, negate: bool) -> _Node:
        pattern = self.string_literal("LIKE pattern")
        escape: str | None = None
        if self.at_kw("ESCAPE"):
            self.take()
            esc = self.string_literal("ESCAPE character")
            if len(esc.value) != 1:
                self.fail(esc.pos, "ESCAPE must be exactly one character")
            escape = esc.value
        match = _like_matcher(pattern.value, escape)
        if match is None:
            self.fail(pattern.pos, "LIKE pattern ends with its ESCAPE character")
        return _like(subject, match, negate)

    def sum_(self) -> _Node:
        node = self.product()
        while self.at_op("+", "-"):
            op = self.take().value
            right = self.product()
            node = self.nest(_arith(op, node, right), node, right)
        return node

    def product(self) -> _Node:
        node = self.unary()
        while self.at_op("*", "/"):
            op = self.take().value
            right = self.unary()
            node = self.nest(_arith(op, node, right), node, right)
        return node

    def unary(self) -> _Node:
        if self.at_op("+", "-"):
            tok = self.take()
            self.enter(tok.pos)
            operand = self.unary()
            self.level -= 1
            return self.nest(_unary(tok.value, operand, tok.pos), operand)
        return self.primary()

    def primary(self) -> _Node:
        tok = self.peek()
        if tok.kind == "num":
            self.take()
            return _const(tok.value, _NUM, tok.pos)
        if tok.kind == "str":
            self.take()
            return _const(tok.value, _STR, tok.pos)
        if tok.kind == "ident":
            self.take()
            slot = self.slots.setdefault(tok.value, len(self.slots))
            return _slot_node(slot, tok.pos)
        if tok.kind == "kw" and tok.value in ("TRUE", "FALSE"):
            self.take()
            return _const(tok.value == "TRUE", _BOOL, tok.pos)
        if tok.kind == "kw" and tok.value == "NULL":
            self.take()
            return _const(None, _ANY, tok.pos)
        if tok.kind == "op" and tok.value == "(":
            self.take()
            self.enter(tok.pos)
            node = self.or_()
            self.level -= 1
            self.expect_op(")")
            node.pos = tok.pos
            return node
        self.unexpected(tok)


# --------------------------------------------------------------------------
# Content-header decoding (AMQP 0-9-1 basic class, as pamqp encodes it)

_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_BASIC_CLASS_ID: Final = 60

# Basic property list order, with each property's flag bit and wire type.
_SHORTSTR, _OCTET, _TIMESTAMP, _TABLE = 0, 1, 2, 3
_PROPERTIES: Final = (
    ("content_type", 0x8000, _SHORTSTR),
    ("content_encoding", 0x4000, _SHORTSTR),
    ("headers", 0x2000, _TABLE),
    ("delivery_mode", 0x1000, _OCTET),
    ("priority", 0x0800, _OCTET),
    ("correlation_id", 0x0400, _SHORTSTR),
    ("reply_to", 0x0200, _SHORTSTR),
    ("expiration", 0x0100, _SHORTSTR),
    ("message_id", 0x0080, _SHORTSTR),
    ("timestamp", 0x0040, _TIMESTAMP),
    ("type", 0x0020, _SHORTSTR),
    ("user_id", 0x0010, _SHORTSTR),
    ("app_id", 0x0008, _SHORTSTR),
    ("cluster_id", 0x0004, _SHORTSTR),
)


def _text(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return _OPAQUE


def _expiration(raw: bytes) -> Any:
    # RabbitMQ-style per-message TTL: a decimal string of milliseconds.
    return int(raw) if raw.isdigit() else None


def _delivery_mode(mode: int) -> str:
    return "PERSISTENT" if mode == 2 else "NON_PERSISTENT"


def _identity(value: int) -> int:
    return value


def _timestamp_ms(raw: int) -> int:
    # pamqp's rule: the field is seconds, unless it is too big to be seconds
    # before 2106, in which case a publisher already sent milliseconds.
    return raw if raw > 0xFFFFFFFF else raw * 1000


# JMS header identifier -> (basic property, converter of its raw value).
_JMS_IDENTIFIERS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "JMSPriority": ("priority", _identity),
    "JMSCorrelationID": ("correlation_id", _text),
    "JMSMessageID": ("message_id", _text),
    "JMSType": ("type", _text),
    "JMSTimestamp": ("timestamp", _timestamp_ms),
    "JMSDeliveryMode": ("delivery_mode", _delivery_mode),
    "JMSExpiration": ("expiration", _expiration),
    "JMSReplyTo": ("reply_to", _text),
}
# What an absent property reads as, where JMS defines one.
_JMS_DEFAULTS: Final[dict[str, Any]] = {"JMSPriority": 4, "JMSDeliveryMode": "NON_PERSISTENT"}

# Field-table value sizes by type octet; -1: a u32 length prefix follows.
_FIELD_SIZES: Final[dict[int, int]] = {
    ord("t"): 1,
    ord("b"): 1,
    ord("B"): 1,
    ord("s"): 2,
    ord("u"): 2,
    ord("I"): 4,
    ord("i"): 4,
    ord("l"): 8,
    ord("L"): 8,
    ord("f"): 4,
    ord("d"): 8,
    ord("D"): 5,
    ord("T"): 8,
    ord("V"): 0,
    0: 0,
    ord("S"): -1,
    ord("A"): -1,
    ord("F"): -1,
    ord("x"): -1,
}
# Scalars decoded here with one struct call (as pamqp's decoders would).
_FIELD_SCALARS: Final[dict[int, struct.Struct]] = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
    ord("L"): struct.Struct(">q"),
    ord("f"): struct.Struct(">f"),
    ord("d"): struct.Struct(">d"),
}
_DECIMAL: Final = struct.Struct(">Bi")


def _field_value(code: int, data: bytes, off: int, size: int) -> Any:
    """Decode the table value of type ``code`` at ``data[off:off + size]``."""
    scalar = _FIELD_SCALARS.get(code)
    if scalar is not None:
        return scalar.unpack_from(data, off)[0]
    if code == 0x53 or code == 0x78:  # "S" long string, "x" byte array
        return _text(data[off + 4 : off + size])
    if code == 0x74:  # "t"
        return data[off] != 0
    if code == 0x44:  # "D": the spec's mantissa is signed (pamqp reads it unsigned)
        scale, mantissa = _DECIMAL.unpack_from(data, off)
        return mantissa / 10**scale  # int / int is correctly rounded
    if code == 0x56 or code == 0:  # "V" void: no value, so NULL
        return None
    if code != 0x54:  # "A" array, "F" table: let pamqp validate the nesting
        decode.TABLE_MAPPING[bytes((code,))](data[off : off + size])
    # JMS has no timestamp, array or table type: present, but UNKNOWN in any
    # comparison.
    return _OPAQUE


def _scan_table(data: bytes, off: int, wanted: Mapping[bytes, int], values: list[Any]) -> int:
    """Walk the field table at ``off``, storing the values of the ``wanted``
    keys (raw key bytes -> slot); return the offset after the table."""
    end = off + 4 + _U32.unpack_from(data, off)[0]
    if end > len(data):
        raise ValueError("field table overruns the header")
    if not wanted:
        return end
    off += 4
    sizes = _FIELD_SIZES
    while off < end:
        key_end = off + 1 + data[off]
        key = data[off + 1 : key_end]
        code = data[key_end]
        off = key_end + 1
        size = sizes[code]  # KeyError on an unknown type: malformed
        if size < 0:
            size = 4 + _U32.unpack_from(data, off)[0]
        if off + size > end:
            raise ValueError("field value overruns its table")
        slot = wanted.get(key)
        if slot is not None:
            values[slot] = _field_value(code, data, off, size)
        off += size
    return end


def _normalize(value: Any) -> Any:
    """Map a Python value onto the selector's types (for matches_fields)."""
    if value is None or value is True or value is False:
        return value
    t = type(value)
    if t is int or t is float or t is str:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Decimal):
        # As a double, as Java would compare it; keeps 0.1 == 0.1 true.
        return float(value) if value.is_finite() else _OPAQUE
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _text(bytes(value))
    return _OPAQUE


# --------------------------------------------------------------------------
# Public API


class Selector:
    """A compiled selector; ``matches`` is safe to call from any thread."""

    __slots__ = ("_always", "_defaults", "_fn", "_header_slots", "_names", "_plan", "text")

    def __init__(self, text: str, fn: _Eval, names: list[str]) -> None:
        self.text = text
        self._fn = fn
        self._names = names
        defaults: list[Any] = [_JMS_DEFAULTS.get(name) for name in names]
        self._defaults = defaults
        # A selector that names no identifiers has the same answer for every
        # message, so matches() can skip decoding altogether.
        self._always: bool | None = (fn([]) is True) if not names else None

        by_property: dict[str, tuple[int, Callable[[Any], Any]]] = {}
        header_slots: dict[bytes, int] = {}
        for slot, name in enumerate(names):
            jms = _JMS_IDENTIFIERS.get(name)
            if jms is not None:
                by_property[jms[0]] = (slot, jms[1])
            else:
                header_slots[name.encode("utf-8")] = slot
        self._header_slots = header_slots
        # The properties to walk, in wire order, up to the last one needed:
        # (flag bit, wire type, slot or -1 to skip, converter).
        plan: list[tuple[int, int, int, Callable[[Any], Any]]] = []
        needed = 0
        for prop, bit, wire in _PROPERTIES:
            slot, conv = by_property.get(prop, (-1, _identity))
            plan.append((bit, wire, slot, conv))
            if slot >= 0 or (prop == "headers" and header_slots):
                needed = len(plan)
        self._plan = tuple(plan[:needed])

    @property
    def identifiers(self) -> frozenset[str]:
        """The identifiers the selector reads."""
        return frozenset(self._names)

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"

    def matches(self, header: bytes | bytearray | memoryview) -> bool:
        """Whether the message with this content-header frame payload (class
        id, weight, body size, property flags, property list) is selected.
        A malformed header is not selected; nothing is raised."""
        always = self._always
        if always is not None:
            return always
        try:
            data = header if type(header) is bytes else bytes(header)
            return self._fn(self._extract(data)) is True
        except Exception:  # any malformation of the untrusted bytes: no match
            return False

    def matches_fields(self, fields: Mapping[str, Any]) -> bool:
        """``matches`` over already-resolved identifier values (``JMSPriority``
        and the like included; no defaults are applied). Absent is NULL."""
        always = self._always
        if always is not None:
            return always
        return self._fn([_normalize(fields.get(name)) for name in self._names]) is True

    def _extract(self, data: bytes) -> list[Any]:
        """The identifiers' values, by slot, decoding no more than needed."""
        values = self._defaults.copy()
        if data[0] != 0 or data[1] != _BASIC_CLASS_ID:
            raise ValueError("not a basic-class content header")
        flags = (data[12] << 8) | data[13]
        off = 14
        word = flags
        while word & 1:  # continuation flag words: no 0-9-1 property lives there
            word = (data[off] << 8) | data[off + 1]
            off += 2
        size = len(data)
        for bit, wire, slot, conv in self._plan:
            if not flags & bit:
                continue
            if wire == _SHORTSTR:
                end = off + 1 + data[off]
                if end > size:
                    raise ValueError("short string overruns the header")
                if slot >= 0:
                    values[slot] = conv(data[off + 1 : end])
                off = end
            elif wire == _TABLE:
                off = _scan_table(data, off, self._header_slots, values)
            elif wire == _OCTET:
                if slot >= 0:
                    values[slot] = conv(data[off])
                off += 1
            else:
                if slot >= 0:
                    values[slot] = conv(_U64.unpack_from(data, off)[0])
                off += 8
        return values


def _match_all(env: list[Any]) -> bool:
    return True


def compile_selector(text: str) -> Selector:
    """Compile JMS selector ``text``; raises SelectorError with the position.

    An empty (or all-blank) selector is no selector: it matches everything."""
    if not text.strip():
        return Selector(text, _match_all, [])
    parser = _Parser(text)
    node = parser.parse()
    names = sorted(parser.slots, key=parser.slots.__getitem__)
    return Selector(text, node.fn, names)
