"""SDK compatibility: does a plugin's ``engine-sdk`` requirement admit the installed SDK?

Uses ``packaging`` when it is installed; otherwise a small comparator for the operators
plugins use (``>=``, ``<``, ``==``, ``!=``, ``<=``, ``>``, ``~=``, with ``.*`` on ``==``).
"""

from __future__ import annotations

import re

_CLAUSE = re.compile(r"^\s*(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9a-zA-Z.*+!-]*)\s*$")


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def _clause_ok(op: str, bound: str, version: str) -> bool:
    have = _release(version)
    if bound.endswith(".*"):
        prefix = _release(bound[:-2])
        match = have[: len(prefix)] == prefix
        return match if op == "==" else not match
    want = _release(bound)
    have_p, want_p = _pad(have, want)
    if op == "~=":
        upper = want[:-1]
        return have_p >= want_p and have[: len(upper)] == upper
    return {
        "==": have_p == want_p,
        "!=": have_p != want_p,
        "<=": have_p <= want_p,
        ">=": have_p >= want_p,
        "<": have_p < want_p,
        ">": have_p > want_p,
    }[op]


def specifier_contains(specifier: str, version: str) -> bool:
    """Whether ``version`` satisfies ``specifier`` (e.g. ``">=0.1,<0.2"``); empty: any."""
    if not specifier.strip():
        return True
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        pass
    else:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    for clause in specifier.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            raise ValueError(f"cannot read version specifier {clause!r} in {specifier!r}")
        if not _clause_ok(match.group(1), match.group(2), version):
            return False
    return True


def sdk_requirement(requires: list[str] | None) -> str | None:
    """The ``engine-sdk`` specifier among a distribution's requirements, or ``None``."""
    for requirement in requires or []:
        head = requirement.split(";")[0].strip()
        match = re.match(r"^engine[-_.]sdk\s*(\[[^\]]*\])?\s*\(?([^)]*)\)?$", head, re.I)
        if match:
            return match.group(2).strip()
    return None
