"""Numbers held exactly by a grammar: integer ranges as digit runs, number ranges at whole-number
bounds, and `multipleOf` as the remainder automaton of the decimal digits (or, when bounded,
the multiples written out).

A decimal number's digits are read left to right; its remainder modulo p after each digit is
(10 r + d) mod p, so "a multiple of p / 10^k" is a finite automaton over digits with p states per
fraction digit: one GBNF rule per state. Bounded numbers and multiples are written without an
exponent (100, not 1e2): the same value, one way fewer to write it.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from llmchat.engine.schema_algebra import Refusal

if TYPE_CHECKING:
    from llmchat.engine.schema_rules import RuleBook

MAX_INTEGER_DIGITS = 16  # what the integer rule allows on an open side
MAX_ENUMERATED = 256
MAX_STATES = 600
ANY_FRACTION = '("." [0-9]{1,16})?'
ZERO_FRACTION = '("." "0"{1,16})?'
SOME_FRACTION = '"." "0"{0,15} [1-9] [0-9]{0,15}'

Bound = tuple[Decimal, bool]  # (value, exclusive)


def bounds(node: dict[str, Any], where: str, integer: bool) -> tuple[Bound | None, Bound | None]:
    """The tightest lower and upper bound of the bounds keywords. A number's bounds must be whole
    numbers (an integer's may be anything: they are rounded inward)."""
    low: Bound | None = None
    high: Bound | None = None
    for key, exclusive, is_low in (
        ("minimum", False, True),
        ("exclusiveMinimum", True, True),
        ("maximum", False, False),
        ("exclusiveMaximum", True, False),
    ):
        if key not in node:
            continue
        raw = node[key]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise Refusal(key, where, "must be a finite number")
        value = Decimal(repr(raw)) if isinstance(raw, float) else Decimal(raw)
        if value != value.to_integral_value():
            if not integer:
                raise Refusal(key, where, "is not a whole number: the grammar bounds numbers at whole numbers")
            value, exclusive = (value.to_integral_value(rounding="ROUND_CEILING" if is_low else "ROUND_FLOOR"), False)
        if is_low:
            if low is None or value > low[0] or (value == low[0] and exclusive):
                low = (value, exclusive)
        elif high is None or value < high[0] or (value == high[0] and exclusive):
            high = (value, exclusive)
    return low, high


def integer_range_rule(low: int | None, high: int | None) -> str:
    """A GBNF expression for the integers in [low, high], written without leading zeros.

    An open side is bounded by what a 16-digit integer can hold, as the plain integer rule is."""
    limit = 10**MAX_INTEGER_DIGITS - 1
    low = -limit if low is None else low
    high = limit if high is None else high
    parts = []
    if low < 0:
        negatives = _digit_ranges(max(1, -high) if high < 0 else 1, -low)
        parts.append('"-" (' + " | ".join(negatives) + ")")
    if high >= 0:
        parts.extend(_digit_ranges(max(low, 0), high))
    return " | ".join(parts)


def _digit_ranges(low: int, high: int) -> list[str]:
    """Split [low, high] (non-negative) into runs that a prefix, one digit range and k free digits spell."""
    rules = []
    if low == 0:
        rules.append('"0"')
        low = 1
    while low <= high:
        step = 1
        while low % (step * 10) == 0 and low + step * 10 - 1 <= high:
            step *= 10
        count = min((high - low + 1) // step, 10 - (low // step) % 10)
        first = (low // step) % 10
        prefix = str(low // (step * 10)) if low >= step * 10 else ""
        digits = f"[{first}-{first + count - 1}]" if count > 1 else f'"{first}"'
        free = " [0-9]" * len(str(step)[1:])
        rules.append((f'"{prefix}" ' if prefix else "") + digits + free)
        low += count * step
    return rules


def _non_negative(low: Bound, high: Bound | None) -> list[str]:
    """Numbers y >= 0 within the bounds (whole-number bounds), as integer part and fraction."""
    (lo, lo_x), parts = low, []
    first = int(lo) + (1 if lo_x else 0)
    last = None if high is None else int(high[0]) - 1
    if last is None or first <= last:
        parts.append(f"({integer_range_rule(first, last)}) {ANY_FRACTION}")
    if lo_x and (high is None or high[0] > lo):
        parts.append(f"({integer_range_rule(int(lo), int(lo))}) {SOME_FRACTION}")
    if high is not None and not high[1] and (high[0] > lo or (high[0] == lo and not lo_x)):
        parts.append(f"({integer_range_rule(int(high[0]), int(high[0]))}) {ZERO_FRACTION}")
    return parts


def number_range_rule(low: Bound | None, high: Bound | None) -> str | None:
    """Numbers (not only integers) within whole-number bounds, without an exponent."""
    parts = []
    if high is None or high[0] > 0 or (high[0] == 0 and not high[1]):
        start = (Decimal(0), False) if low is None or low[0] < 0 else low
        parts += _non_negative(start, high)
    if low is None or low[0] < 0:  # negatives: -y with y > 0
        floor = (Decimal(0), True) if high is None or high[0] >= 0 else (-high[0], high[1])
        ceiling = None if low is None else (-low[0], low[1])
        negatives = _non_negative(floor, ceiling)
        if negatives:
            parts.append('"-" (' + " | ".join(negatives) + ")")
    return f"({' | '.join(parts)}) space" if parts else None


def multiple_rule(
    compiler: RuleBook,
    step: Any,
    low: Bound | None,
    high: Bound | None,
    integer: bool,
    excluded: list[Any],
    where: str,
    name: str,
) -> str | None:
    """Numbers that are multiples of `step`: written out when bounded, an automaton when not."""
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
        raise Refusal("multipleOf", where, "must be a positive number")
    unit = Decimal(repr(step)) if isinstance(step, float) else Decimal(step)
    if low is not None and high is not None:
        return _written_out(unit, low, high, integer, excluded, where)
    if excluded:
        raise Refusal("not", where, "beside an unbounded multipleOf cannot be held by the grammar")
    if low is not None or high is not None:
        raise Refusal("multipleOf", where, "with a bound on one side only cannot be held; bound both sides")
    sign, digits, exponent = unit.normalize().as_tuple()
    p = int("".join(map(str, digits)))
    k = -int(exponent) if int(exponent) < 0 else 0
    if int(exponent) > 0:
        p *= 10 ** int(exponent)
    if integer or k == 0:
        p, k, integer = p // math.gcd(p, 10**k), 0, True
    if p * (k + 1) > MAX_STATES:
        raise Refusal("multipleOf", where, f"{step} needs {p * (k + 1)} grammar states; at most {MAX_STATES} are held")
    return _automaton(compiler, p, k, integer, name)


def _written_out(unit: Decimal, low: Bound, high: Bound, integer: bool, excluded: list[Any], where: str) -> str | None:
    first = (low[0] / unit).to_integral_value(rounding="ROUND_CEILING")
    last = (high[0] / unit).to_integral_value(rounding="ROUND_FLOOR")
    if last - first + 1 > MAX_ENUMERATED:
        raise Refusal("multipleOf", where, f"allows more than {MAX_ENUMERATED} values between its bounds")
    texts = []
    n = first
    while n <= last:
        value = n * unit
        n += 1
        if (low[1] and value == low[0]) or (high[1] and value == high[0]):
            continue
        if integer and value != value.to_integral_value():
            continue
        if any(Decimal(repr(v) if isinstance(v, float) else v) == value for v in excluded):
            continue
        text = format(value.normalize(), "f") if value != 0 else "0"
        texts.append(f'"{text}"')
    return f"({' | '.join(texts)}) space" if texts else None


def _automaton(compiler: RuleBook, p: int, k: int, integer: bool, name: str) -> str:
    """Decimal numbers whose value times 10^k is a multiple of p (k fraction digits at most).

    States: `-i{r}` in the integer part with remainder r, `-f{r}-{j}` after j fraction digits.
    A fraction state from which no accepting state can be reached gets no rule, and no move to it."""
    base = compiler.add(f"{compiler.prefix(name)}multiple", '""')  # a unique prefix for the state rules

    def accepts(r: int, j: int) -> bool:
        return (r * 10 ** (k - j)) % p == 0

    alive = {(r, k) for r in range(p) if accepts(r, k)}
    for j in range(k - 1, 0, -1):
        for r in range(p):
            if accepts(r, j) or any(((10 * r + d) % p, j + 1) in alive for d in range(10)):
                alive.add((r, j))

    def moves(r: int, j: int | None, first: bool = False) -> list[str]:
        """Digit moves from remainder r into the integer part (j None) or fraction digit j."""
        by_target: dict[int, list[int]] = {}
        for d in range(1 if first else 0, 10):
            target = (10 * r + d) % p
            if j is None or (target, j) in alive:
                by_target.setdefault(target, []).append(d)
        state = base + ("-i{}" if j is None else f"-f{{}}-{j}")
        return [f"[{''.join(map(str, ds))}] {state.format(t)}" for t, ds in by_target.items()]

    def ends(r: int) -> list[str]:
        out = ['""'] if accepts(r, 0) else []
        if not integer and k > 0 and moves(r, 1):
            out.append(f'"." ({" | ".join(moves(r, 1))})')
        return out

    for r in range(p):
        compiler.rules[f"{base}-i{r}"] = " | ".join(moves(r, None) + ends(r))
        for j in range(1, k + 1):
            if (r, j) in alive:
                ways = (['""'] if accepts(r, j) else []) + (moves(r, j + 1) if j < k else [])
                compiler.rules[f"{base}-f{r}-{j}"] = " | ".join(ways)
    zero = " | ".join(ends(0))
    compiler.rules[base] = f'"-"? ("0" ({zero}) | {" | ".join(moves(0, None, first=True))}) space'
    return base
