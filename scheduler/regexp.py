"""Regular expressions of ``regexp`` constraints and affinities: RE2, as Nomad's Go is.

A constraint's pattern comes from whoever can submit a job and is matched against every
node's attribute on every evaluation. Python's ``re`` backtracks, so ``^(a+)+$`` against a
longer and longer string doubles its time with each character and one job stalls the
scheduler (ReDoS). RE2 matches in time linear in the text, whatever the pattern, and its
syntax is the one Go's ``regexp`` reads (no backreferences, no lookaround), which is the
dialect Nomad users' patterns are written in. One compile path serves validation and
feasibility, so a pattern that validates is exactly one that can be matched.

Pure: RE2 is a library call with no I/O; the compiled-pattern cache is ``re2``'s own
bounded LRU (128 patterns), deterministic like everything else here.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import re2

__all__ = ["MAX_PATTERN_MEMORY_BYTES", "Pattern", "RegexpError", "compile_regexp", "matches", "regexp_error"]

# RE2's own budget for one compiled program (its default): a pattern that needs more is
# refused at validation with "pattern too large", never half-built at match time.
MAX_PATTERN_MEMORY_BYTES: Final = 8 << 20


class RegexpError(ValueError):
    """A pattern RE2 refuses; the message is RE2's reason, on one line."""


class Pattern(Protocol):
    def search(self, text: str) -> object | None: ...


def _options() -> Any:
    options = re2.Options()
    # RE2 writes every refused pattern to stderr otherwise: a job submitter could fill
    # the server's log through it.
    options.log_errors = False
    options.max_mem = MAX_PATTERN_MEMORY_BYTES
    return options


_OPTIONS: Final = _options()


def compile_regexp(pattern: str) -> Pattern:
    """``pattern`` compiled with Go's semantics (unanchored ``search``); raises RegexpError."""
    try:
        compiled: Pattern = re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        raise RegexpError(_reason(exc)) from exc
    except UnicodeError as exc:  # a lone surrogate cannot be UTF-8, the only text RE2 reads
        raise RegexpError("pattern is not valid UTF-8 text") from exc
    return compiled


def regexp_error(pattern: str) -> str:
    """Why ``pattern`` does not compile, or "" when it does."""
    try:
        compile_regexp(pattern)
    except RegexpError as exc:
        return str(exc)
    return ""


def matches(pattern: Pattern, text: str) -> bool:
    """Whether ``pattern`` occurs in ``text``; text RE2 cannot read never matches."""
    try:
        return pattern.search(text) is not None
    except UnicodeError:
        return False


def _reason(exc: BaseException) -> str:
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return " ".join(text.split()) or "invalid pattern"
