"""The one answer/question normalisation: exact match (the reward's em / subem / f1), the QA
readers' check for gold answers that normalise to nothing, and the train/test overlap check.

Two modes (`reward.normalize`):

- ``unicode`` (default): NFKC (so NFD ``Beyoncé`` is NFC ``Beyoncé`` and full-width
  ``ＰＡＲＩＳ`` is ``PARIS``), typographic quotes and dashes mapped to their ASCII forms
  (``N’ Roses`` is ``N' Roses``, ``“Paris”`` is ``"Paris"``, ``Jay–Z`` is ``Jay-Z``), soft
  hyphens and zero-width characters dropped, lower case; then SQuAD's steps below. An ASCII
  text skips the Unicode steps, so it normalises exactly as under ``squad``.
- ``squad``: the official SQuAD v1.1 script's ``normalize_answer``, bit for bit, as
  Search-R1 scores (``verl/utils/reward_score/qa_em.py``): lower case, drop ASCII
  punctuation, drop the articles a/an/the, collapse whitespace. No Unicode normalisation:
  ``Beyonce\\u0301`` (NFD) does not equal ``Beyoncé`` and ``’`` is not punctuation.

Standard library only: `agent_rl.rollout.reward` imports it (tests/test_import_rules.py).
"""

from __future__ import annotations

import re
import string
import unicodedata

MODES = ("unicode", "squad")
DEFAULT = "unicode"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
# Typographic forms NFKC leaves alone (it maps the full-width ones already). Kept to
# quotes, dashes and invisible characters: the marks a copy from a web page or a word
# processor adds to a plain answer.
_TYPOGRAPHIC = str.maketrans({
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2035\u02bc", "'"),  # ‘ ’ ‚ ‛ ′ ‵ ʼ
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb\u2039\u203a", '"'),  # “ ” „ ‟ ″ ‶ « » ‹ ›
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63", "-"),  # ‐ ‑ ‒ – — ― − ﹘ ﹣
    **dict.fromkeys("\u00ad\u200b\u200c\u200d\u2060\ufeff", None),  # soft hyphen, zero-width
})


def _squad(s: str) -> str:
    # the official SQuAD v1.1 order: lower, remove_punc, remove_articles, white_space_fix
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _unicode(s: str) -> str:
    if s.isascii():
        return _squad(s)
    s = unicodedata.normalize("NFKC", s).translate(_TYPOGRAPHIC).lower()
    s = _squad(unicodedata.normalize("NFKC", s))  # lower() can decompose (İ -> i + dot)
    # dropping a character between a letter and its combining mark lets NFKC compose them
    # now: one more pass makes the result a fixed point (normalising it again changes nothing)
    return s if s.isascii() else _squad(unicodedata.normalize("NFKC", s))


_NORMALIZERS = {"unicode": _unicode, "squad": _squad}


def normalize_answer(text: str, mode: str = DEFAULT) -> str:
    """`text` normalised for exact match under `mode` (``unicode`` | ``squad``, see the
    module docstring). A gold answer that normalises to "" ("The", ".", "a") is no answer:
    the readers drop it and the metrics never match it."""
    try:
        fn = _NORMALIZERS[mode]
    except KeyError:
        raise ValueError(f"unknown normalisation {mode!r}; known: {', '.join(MODES)}") from None
    return fn(text)
