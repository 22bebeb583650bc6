"""Remove obvious personal data from prompt text: e-mail addresses, phone numbers, card numbers.

A regex scrub, not anonymization: it replaces what is unmistakably an e-mail address, a phone
number (international ``+CC`` numbers, Korean mobile/landline/business numbers, North American
numbers) or a Luhn-valid card number with a placeholder, and leaves dates, version numbers,
prices, times and other numbers alone. Rules, in the order they run:

1. ``<EMAIL>``: ``local@domain.tld`` (local part in Latin letters, accented ones included; ASCII
   domain; TLD of two letters or more).
2. ``<CARD>``: 13-19 digits, either contiguous or in groups separated by one kind of separator
   (space or dash) — 4-4-4-1..7 or the 4-6-4/5 layout of Amex/Diners — and passing the Luhn check.
   Card-like numbers that fail the Luhn check are left alone (they are usually order or tracking ids).
3. ``<PHONE>``: ``+CC`` followed by digit groups (``+82 10 1234 5678``, ``+1 (555) 123-4567``,
   ``+44 20 7946 0958``, ``+44 7700 900481``); Korean ``0XX-XXXX-XXXX`` / ``(0X) XXX-XXXX`` with
   separators, mobile numbers ``01X`` without them (``01012345678``) and business numbers
   ``1588-1234``; North American ``(555) 123-4567`` and ``555-123-4567`` / ``555.123.4567`` /
   ``555 123 4567`` (area code and exchange starting 2-9), optionally after ``1-``; UK-style ``07700 900 481``.
   A match must hold 7-15 digits.

A number glued to ASCII letters or digits is never matched; Hangul around it is fine
(``010-1234-5678로``, ``카드번호:4111...``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EMAIL = "<EMAIL>"
PHONE = "<PHONE>"
CARD = "<CARD>"


@dataclass(frozen=True)
class ScrubCounts:
    """How many e-mails, phone numbers and card numbers were replaced."""

    email: int = 0
    phone: int = 0
    card: int = 0

    @property
    def total(self) -> int:
        return self.email + self.phone + self.card

    def __add__(self, other: ScrubCounts) -> ScrubCounts:
        return ScrubCounts(self.email + other.email, self.phone + other.phone, self.card + other.card)

    def to_dict(self) -> dict[str, int]:
        return {"email": self.email, "phone": self.phone, "card": self.card}


# Local part: ASCII plus Latin letters with diacritics (internationalized addresses such as
# "åsa@example.se"); Hangul is left out so "메일은abc@example.com" keeps the Korean word.
_LOCAL = "A-Za-z0-9\u00c0-\u024f"
_EMAIL_RE = re.compile(
    rf"(?<![{_LOCAL}._%+-])[{_LOCAL}][{_LOCAL}._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}(?![A-Za-z0-9-])"
)

# Not glued to ASCII word characters or to a digit group on the left ("1,234", "v1.2", "3.14").
_LEFT = r"(?<![A-Za-z0-9_+])(?<!\d[.,])"
_RIGHT = r"(?![A-Za-z0-9_])(?![.,]\d)"

_CARD_RE = re.compile(
    _LEFT
    + r"(?:"
    + r"\d{13,19}"  # contiguous
    + r"|\d{4}(?P<s1>[ -])\d{4}(?P=s1)\d{4}(?P=s1)\d{1,7}"  # 4-4-4-x (Visa, Mastercard, ...)
    + r"|\d{4}(?P<s2>[ -])\d{6}(?P=s2)\d{4,5}"  # 4-6-5 (Amex), 4-6-4 (Diners)
    + r")"
    + _RIGHT
)

_PHONE_RE = re.compile(
    _LEFT
    + r"(?:"
    # international: +CC, optional (area), groups
    + r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,4}){0,3}[ .-]\d{2,6}"
    # Korean with separators: 010-1234-5678, 02-123-4567, 031.123.4567, (02) 123-4567
    + r"|0\d{1,2}[-. ]\d{3,4}[-. ]\d{4}"
    + r"|\(0\d{1,2}\)[ ]?\d{3,4}[-. ]\d{4}"
    # Korean mobile without separators: 01012345678
    + r"|01[016789]\d{7,8}"
    # Korean business numbers: 1588-1234, 1644-0000, 1800-1234
    + r"|1[568]\d{2}-\d{4}"
    # UK-style national numbers with spaces: 07700 900 481, 0161 555 0147
    + r"|0\d{3,4} \d{3} \d{3,4}"
    # North American: (555) 123-4567, 555-123-4567, 555.123.4567, 555 123 4567, with an optional 1-
    + r"|(?:1[-. ])?\(\d{3}\)[ ]?\d{3}[-. ]\d{4}"
    + r"|(?:1[-.])?\d{3}(?P<na>[-.])\d{3}(?P=na)\d{4}"
    # ... and with spaces only where area code and exchange are valid (first digit 2-9)
    + r"|(?:1 )?[2-9]\d{2} [2-9]\d{2} \d{4}"
    + r")"
    + _RIGHT
)


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a digit string (card numbers pass it)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def scrub_text(text: str) -> tuple[str, ScrubCounts]:
    """Replace e-mails, card numbers and phone numbers in ``text``; return it and the counts."""
    text, n_email = _EMAIL_RE.subn(EMAIL, text)

    n_card = 0

    def card(match: re.Match[str]) -> str:
        nonlocal n_card
        digits = _digits(match.group(0))
        if 13 <= len(digits) <= 19 and luhn_ok(digits):
            n_card += 1
            return CARD
        return match.group(0)

    text = _CARD_RE.sub(card, text)

    n_phone = 0

    def phone(match: re.Match[str]) -> str:
        nonlocal n_phone
        if 7 <= len(_digits(match.group(0))) <= 15:
            n_phone += 1
            return PHONE
        return match.group(0)

    text = _PHONE_RE.sub(phone, text)
    return text, ScrubCounts(email=n_email, phone=n_phone, card=n_card)


def scrub_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], ScrubCounts]:
    """Scrub the ``content`` of every chat message (roles are kept); return copies and counts."""
    out: list[dict[str, Any]] = []
    counts = ScrubCounts()
    for message in messages:
        new = dict(message)
        if isinstance(new.get("content"), str):
            new["content"], found = scrub_text(new["content"])
            counts = counts + found
        out.append(new)
    return out, counts
