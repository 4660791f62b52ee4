r"""MATH answer extraction and equivalence, after the standard MATH graders.

Extraction: the content of the last ``\boxed{...}`` (or ``\fbox{...}``, or ``\boxed 5``) with
balanced braces; failing that, "The final answer is X" (the Minerva format); else nothing.

Equivalence (:func:`is_equiv`), most lenient first to fail:

1. Hendrycks normalisation (:func:`normalize`, the ``is_equiv`` of the MATH paper): drop
   ``\left``/``\right``, ``\!``, spaces, ``^\circ``/``^{\circ}``, ``\$``, ``\%``, a trailing unit
   in ``\text{...}``, a leading ``x =``; ``dfrac``/``tfrac`` -> ``frac``; ``\frac12`` ->
   ``\frac{1}{2}``, ``\sqrt2`` -> ``\sqrt{2}``, ``a/b`` -> ``\frac{a}{b}``, ``0.5`` -> ``\frac{1}{2}``;
   then compare strings.
2. The PRM800K grader's stricter rules on a second normalisation (:func:`normalize_loose`:
   ``\text{}`` unwrapped, units and ``%`` dropped, ``1,000`` -> ``1000``, lower case) and, per
   element of a tuple/interval (brackets must match): fractions of integers must match exactly
   (``\frac{2}{4}`` is not ``\frac{1}{2}``); an integer reference needs an integer answer;
   otherwise both sides are parsed into sympy by a small LaTeX parser that never calls ``eval``
   (:func:`parse_latex`) and compared: equal when the difference simplifies to 0 (numbers:
   ``|a - b| <= 1e-9 * max(1, |b|)`` at 30 digits).

Guards against pathological answers: elements over 200 characters, integer literals over 50 digits
or numeric exponents over 1000 are not parsed, and ``sympy.simplify`` runs under a 2 s timer
(SIGALRM, main thread only); a guard or a timeout means "not shown equal".
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from typing import Any, Iterator

# -- extraction -------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}``/``\fbox{...}`` (balanced braces), or None."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = i + (len("\\boxed") if text.startswith("\\boxed", i) else len("\\fbox"))
    if text.startswith(" ", j) and not text.startswith(" {", j):  # "\boxed 5": up to the next "$" or space
        m = re.match(r" +([^\s$]+)", text[j:])
        return m.group(1) if m else None
    while j < len(text) and text[j] == " ":
        j += 1
    if j >= len(text) or text[j] != "{":
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k]
    return None  # unbalanced: the box was never closed


_FINAL_RE = re.compile(r"final answer is\s*:?\s*\$?([^\s$:].*?)\$?\s*(?:\.\s*I hope it is correct|\.?\s*$)",
                       re.IGNORECASE | re.MULTILINE)


def extract_answer(text: str) -> str | None:
    """The model's final answer: last boxed content, else the Minerva "final answer is X"."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    found = _FINAL_RE.findall(text)
    if found:
        return found[-1].strip().rstrip(".").strip()
    return None


def reference_answer(solution: str, answer: str | None = None) -> str | None:
    """A record's reference: its ``answer`` field (MATH-500) or the last boxed of its solution."""
    if answer is not None and answer.strip():
        return answer.strip()
    boxed = last_boxed(solution)
    return boxed.strip() if boxed is not None else None


# -- normalisation 1: Hendrycks ---------------------------------------------------------------


def _fix_fracs(s: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``, ``\frac{1}2`` -> ``\frac{1}{2}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{"):
            # \frac{a}b -> \frac{a}{b}
            close = _matching(part, 0)
            if close is not None and close + 1 < len(part) and part[close + 1] not in "{\\":
                part = part[:close + 1] + "{" + part[close + 1] + "}" + part[close + 2:]
            out += part
            continue
        if len(part) < 2:
            out += part
            continue
        a, b = part[0], part[1]
        if b == "{":
            out += "{" + a + "}" + part[1:]
        else:
            out += "{" + a + "}{" + b + "}" + part[2:]
    return out


def _matching(s: str, start: int) -> int | None:
    depth = 0
    for k in range(start, len(s)):
        if s[k] == "{":
            depth += 1
        elif s[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return None


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _remove_right_units(s: str) -> str:
    # "5\text{ cm}" -> "5": a unit written as a trailing \text{ ...} with a leading space
    if "\\text{ " in s:
        head = s.split("\\text{ ")[0]
        return head if head else s
    return s


def normalize(answer: str) -> str:
    """The Hendrycks MATH normalisation (step 1 of the module docstring)."""
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs.strip()) <= 2:
        s = rhs
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s)
    return s.rstrip(".")


# -- normalisation 2: PRM800K-style -----------------------------------------------------------

_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard", "unit", "sq", "square")


def _strip_number_commas(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, re.sub(r"(\d),(\d\d\d)($|\D)", r"\1\2\3", s)
    return s


def normalize_loose(answer: str) -> str:
    s = answer.strip()
    m = re.fullmatch(r"\\text\{(.+?)\}", s)
    if m:
        s = m.group(1)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    for unit in _UNITS:
        s = re.sub(rf"\b{unit}(?:es|s)?\b\s*(?:\^\s*\d+)?", "", s)
    s = s.replace(" or ", ",").replace(" and ", ",")
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and re.fullmatch(r"\s*[a-zA-Z]\s*", lhs):
        s = rhs
    s = _strip_number_commas(s)
    s = s.replace(" ", "").rstrip(".")
    if len(s) > 1 and s[0] == "{" and s[-1] == "}" and _matching(s, 0) == len(s) - 1:
        s = s[1:-1]
    s = _fix_fracs(_fix_sqrt(s))
    with contextlib.suppress(ValueError, OverflowError):
        value = float(s)
        if value == int(value) and re.fullmatch(r"-?[\d.]+", s):
            s = str(int(value))
    return s.lower()


_TUPLE_CHARS = "()[]"


def split_elements(s: str) -> list[str]:
    """The elements of a tuple/interval ``(a,b)``/``[a,b)``, else of a top-level comma list, else ``[s]``."""
    if len(s) > 2 and s[0] in _TUPLE_CHARS and s[-1] in _TUPLE_CHARS and not any(c in s[1:-1] for c in _TUPLE_CHARS):
        return [e for e in s[1:-1].split(",")]
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _is_int_str(s: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", s))


def _is_frac_str(s: str) -> bool:
    return bool(re.fullmatch(r"-?(?:\\frac\{-?\d+\}\{\d+\}|\d+/\d+)", s))


# -- a small LaTeX parser into sympy (no eval) ------------------------------------------------


class ParseError(ValueError):
    pass


MAX_ELEMENT = 200
MAX_DIGITS = 50
MAX_EXPONENT = 1000

_TOKEN_RE = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(\\[a-zA-Z]+)|([a-zA-Z])|(\*\*|[-+*/^(){}\[\]|!,]))")
_FUNCS = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
          "log", "ln", "exp"}
_IGNORED = {"left", "right", "displaystyle", "mathrm", "text", "mathbf", "textbf", "operatorname", "big", "Big",
            "bigl", "bigr", "quad", "qquad", "cdotp"}


def _tokens(s: str) -> list[str]:
    out, pos = [], 0
    while pos < len(s):
        if s[pos:].strip() == "":
            break
        m = _TOKEN_RE.match(s, pos)
        if not m:
            raise ParseError(f"unexpected {s[pos]!r}")
        out.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return out


class _Parser:
    """Recursive descent over tokens, building sympy objects directly::

        expr   := term (('+'|'-') term)*
        term   := unary (('*'|'/'|'\\cdot'|'\\times'|'\\div'|<implicit>) unary)*
        unary  := ('-'|'+') unary | power
        power  := postfix ('^' unary_atom)?
        postfix:= atom '!'*
        atom   := number | letter | '\\pi' | '\\infty' | '\\frac' group group | '\\sqrt' ['[' expr ']'] atom
                | func atom | '(' expr ')' | '{' expr '}' | '|' expr '|'
    """

    def __init__(self, tokens: list[str]):
        import sympy

        self.sp = sympy
        self.t = [t for t in tokens if not (t.startswith("\\") and t[1:] in _IGNORED)]
        self.i = 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ParseError(f"expected {expected or 'more'}, got {tok}")
        self.i += 1
        return tok

    def parse(self) -> Any:
        value = self.expr()
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Any:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def _starts_atom(self, tok: str | None) -> bool:
        if tok is None:
            return False
        return (tok[0].isdigit() or tok[0] == "." or tok.isalpha() or tok in ("(", "{", "\\pi", "\\infty", "\\frac",
                                                                               "\\sqrt")
                or (tok.startswith("\\") and tok[1:] in _FUNCS))

    def term(self) -> Any:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "\\cdot", "\\times"):
                self.take()
                value = value * self.unary()
            elif tok in ("/", "\\div"):
                self.take()
                value = value / self.unary()
            elif self._starts_atom(tok):
                value = value * self.power()
            else:
                return value

    def unary(self) -> Any:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> Any:
        base = self.postfix()
        if self.peek() in ("^", "**"):
            self.take()
            exponent = self.unary() if self.peek() != "{" else self.atom()
            if exponent.is_number and abs(complex(exponent.evalf(15))) > MAX_EXPONENT:
                raise ParseError("exponent too large")
            return self.sp.Pow(base, exponent)
        return base

    def postfix(self) -> Any:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            if not (value.is_Integer and 0 <= value <= 100):
                raise ParseError("factorial of a non-integer or a large number")
            value = self.sp.factorial(value)
        return value

    def group(self) -> Any:
        if self.peek() == "{":
            self.take("{")
            value = self.expr()
            self.take("}")
            return value
        return self.atom()

    def atom(self) -> Any:
        sp = self.sp
        tok = self.take()
        if tok[0].isdigit() or tok[0] == ".":
            if len(tok) > MAX_DIGITS:
                raise ParseError("number too long")
            return sp.Rational(tok) if "." in tok else sp.Integer(tok)
        if tok in ("(", "["):
            value = self.expr()
            self.take(")" if tok == "(" else "]")
            return value
        if tok == "{":
            value = self.expr()
            self.take("}")
            return value
        if tok == "|":
            value = self.expr()
            self.take("|")
            return sp.Abs(value)
        if tok == "\\pi":
            return sp.pi
        if tok == "\\infty":
            return sp.oo
        if tok == "\\frac":
            num = self.group()
            den = self.group()
            return num / den
        if tok == "\\sqrt":
            index = None
            if self.peek() == "[":
                self.take("[")
                index = self.expr()
                self.take("]")
            radicand = self.group()
            return sp.sqrt(radicand) if index is None else sp.root(radicand, index)
        if tok.startswith("\\") and tok[1:] in _FUNCS:
            name = tok[1:]
            arg = self.power() if self.peek() not in ("(", "{") else self.atom()
            fn = {"ln": sp.log, "arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan}.get(name) or getattr(sp, name)
            return fn(arg)
        if tok.isalpha() and len(tok) == 1:
            if tok == "e":
                return sp.E
            if tok == "i":
                return sp.I
            return sp.Symbol(tok)
        raise ParseError(f"cannot parse {tok!r}")


def parse_latex(s: str) -> Any:
    """A sympy expression for a small LaTeX subset (see :class:`_Parser`); ParseError otherwise."""
    if len(s) > MAX_ELEMENT:
        raise ParseError("too long")
    return _Parser(_tokens(s)).parse()


# -- equivalence ------------------------------------------------------------------------------

SIMPLIFY_SECONDS = 2.0


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM-based limit in the main thread of a Unix process; no limit elsewhere."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def sympy_equal(a: str, b: str) -> bool:
    """Whether two normalised element strings parse to expressions whose difference is 0."""
    try:
        with _time_limit(SIMPLIFY_SECONDS):
            x, y = parse_latex(a), parse_latex(b)
            diff = x - y
            if diff == 0:
                return True
            if not diff.free_symbols:
                dv = complex(diff.evalf(30))
                scale = max(1.0, abs(complex(y.evalf(30))))
                return abs(dv) <= 1e-9 * scale
            import sympy

            return sympy.simplify(diff) == 0
    except (_Timeout, ParseError, ValueError, TypeError, ZeroDivisionError, OverflowError, AttributeError,
            RecursionError):
        return False
    except Exception:  # sympy raises a zoo of types on odd input; none of them means "equal"
        return False


def is_equiv(prediction: str | None, reference: str) -> bool:
    """Whether a predicted answer matches the reference (rules in the module docstring)."""
    if prediction is None:
        return False
    if normalize(prediction) == normalize(reference):
        return True
    ref, pred = normalize_loose(reference), normalize_loose(prediction)
    if ref == pred:
        return True
    if not pred:
        return False
    ref_elems, pred_elems = split_elements(ref), split_elements(pred)
    if len(ref_elems) != len(pred_elems):
        return False
    if len(ref_elems) > 1 and ref[0] in _TUPLE_CHARS and (ref[0] != pred[0] or ref[-1] != pred[-1]):
        return False  # interval/tuple brackets must match
    for r, p in zip(ref_elems, pred_elems):
        if r == p:
            continue
        if _is_frac_str(r) and _is_frac_str(p):
            return False  # unreduced or different fractions: no simplification allowed
        if _is_int_str(r) != _is_int_str(p):
            return False
        if not sympy_equal(r, p):
            return False
    return True
