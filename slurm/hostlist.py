"""Slurm host list expressions: ``n[1-4,7]``, ``gpu[001-003]``, ``rack[1-2]-n[1-2]``.

``expand`` keeps the order Slurm would (left to right, ranges ascending as
written) and drops nothing; ``compress`` returns the canonical, naturally sorted
form with duplicates removed, so ``expand(compress(names))`` is the sorted set.
Malformed input raises ``ValueError`` saying what is wrong.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def _split_top_level(expression: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expression:
        if char == "[":
            if depth:
                raise ValueError(f"nested '[' in host list {expression!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"unbalanced ']' in host list {expression!r}")
            depth = 0
        if char == "," and not depth:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unclosed '[' in host list {expression!r}")
    parts.append("".join(current))
    return parts


def _expand_range_list(body: str, expression: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty range in host list {expression!r}")
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in host list {expression!r}")
        if not dash:
            values.append(low)
            continue
        start, stop = int(low), int(high)
        if stop < start:
            raise ValueError(f"descending range {item!r} in host list {expression!r}")
        if stop - start > 1_000_000:
            raise ValueError(f"range {item!r} too large in host list {expression!r}")
        # Zero padding follows the lower bound as written: gpu[001-010].
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        values.extend(str(number).zfill(width) for number in range(start, stop + 1))
    return values


def _expand_one(pattern: str, expression: str) -> list[str]:
    pieces: list[list[str]] = []
    position = 0
    for match in re.finditer(r"\[([^\[\]]*)\]", pattern):
        pieces.append([pattern[position : match.start()]])
        pieces.append(_expand_range_list(match.group(1), expression))
        position = match.end()
    pieces.append([pattern[position:]])
    return ["".join(combination) for combination in itertools.product(*pieces)]


def expand(expression: str | None) -> list[str]:
    """``"n[1-3],gpu07"`` -> ``["n1", "n2", "n3", "gpu07"]``; empty/None/(null) -> []."""
    if expression is None:
        return []
    expression = expression.strip()
    if expression in ("", "(null)", "None", "None assigned", "N/A"):
        return []
    names: list[str] = []
    for part in _split_top_level(expression):
        part = part.strip()
        if not part:
            raise ValueError(f"empty element in host list {expression!r}")
        if any(char.isspace() for char in part):
            raise ValueError(f"whitespace inside host name in host list {expression!r}")
        names.extend(_expand_one(part, expression))
    return names


def natural_key(name: str) -> tuple[str, str, int, int, str]:
    """Sort key: prefix, suffix, then the last number numerically (n2 before n10)."""
    match = _LAST_NUMBER.match(name)
    if not match:
        return (name, "", -1, 0, name)
    prefix, digits, suffix = match.groups()
    return (prefix, suffix, int(digits), len(digits), name)


def _width(digits: str) -> int:
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def compress(names: Iterable[str]) -> str:
    """``["n3", "n1", "n2", "n7"]`` -> ``"n[1-3,7]"`` (sorted, duplicates dropped)."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    plain: list[str] = []
    for name in sorted(set(names), key=natural_key):
        if not name or any(char in name for char in "[],") or any(c.isspace() for c in name):
            raise ValueError(f"cannot compress host name {name!r}")
        match = _LAST_NUMBER.match(name)
        if not match:
            plain.append(name)
            continue
        prefix, digits, suffix = match.groups()
        groups.setdefault((prefix, suffix, _width(digits)), []).append(int(digits))

    rendered: list[tuple[tuple[str, str, int, int, str], str]] = []
    for name in plain:
        rendered.append((natural_key(name), name))
    for (prefix, suffix, width), numbers in groups.items():
        numbers.sort()
        ranges: list[str] = []
        run_start = previous = numbers[0]
        for number in [*numbers[1:], None]:
            if number is not None and number == previous + 1:
                previous = number
                continue
            low, high = str(run_start).zfill(width), str(previous).zfill(width)
            ranges.append(low if run_start == previous else f"{low}-{high}")
            if number is not None:
                run_start = previous = number
        first = f"{prefix}{str(numbers[0]).zfill(width)}{suffix}"
        if len(numbers) == 1:
            rendered.append((natural_key(first), first))
        else:
            rendered.append((natural_key(first), f"{prefix}[{','.join(ranges)}]{suffix}"))
    rendered.sort(key=lambda item: item[0])
    return ",".join(text for _key, text in rendered)
