"""Personal-data scrub: e-mails, phone numbers and card numbers in Korean and English text."""

from __future__ import annotations

import pytest

from draftfit.scrub import ScrubCounts, luhn_ok, scrub_messages, scrub_text

# (text, expected text, (emails, phones, cards)) — all data below is synthetic.
POSITIVE = [
    # English
    ("Contact me at jane.doe+work@example.com please.",
     "Contact me at <EMAIL> please.", (1, 0, 0)),
    ("Reply to ops-team@mail.example.org or billing@example.io.",
     "Reply to <EMAIL> or <EMAIL>.", (2, 0, 0)),
    ("Call (555) 123-4567 after 5pm.", "Call <PHONE> after 5pm.", (0, 1, 0)),
    ("My cell is 555-123-4567, office 555.987.6543.",
     "My cell is <PHONE>, office <PHONE>.", (0, 2, 0)),
    ("Reach us on +1 (555) 123-4567 or +44 20 7946 0958.",
     "Reach us on <PHONE> or <PHONE>.", (0, 2, 0)),
    ("Paid with 4111 1111 1111 1111 yesterday.", "Paid with <CARD> yesterday.", (0, 0, 1)),
    ("Card 4111-1111-1111-1111, Amex 3782 822463 10005, MC 5555555555554444.",
     "Card <CARD>, Amex <CARD>, MC <CARD>.", (0, 0, 3)),
    ("Name: Sam Lee, email sam.lee@example.net, phone +1-555-010-2030, card 6011 1111 1111 1117.",
     "Name: Sam Lee, email <EMAIL>, phone <PHONE>, card <CARD>.", (1, 1, 1)),
    ("UK mobile 07700 900 481, office 0161 555 0147.", "UK mobile <PHONE>, office <PHONE>.", (0, 2, 0)),
    ("Write to åsa.berg@example.se or ånna@example.com.", "Write to <EMAIL> or <EMAIL>.", (2, 0, 0)),
    # Korean
    ("메일은abc@example.com 입니다.", "메일은<EMAIL> 입니다.", (1, 0, 0)),
    ("제 번호는 010-1234-5678이고 메일은 minsu.kim@example.co.kr 입니다.",
     "제 번호는 <PHONE>이고 메일은 <EMAIL> 입니다.", (1, 1, 0)),
    ("해외에서는 +82 10 1234 5678 로 연락 주세요.", "해외에서는 <PHONE> 로 연락 주세요.", (0, 1, 0)),
    ("+82-10-9876-5432번으로 문자 부탁드립니다.", "<PHONE>번으로 문자 부탁드립니다.", (0, 1, 0)),
    ("서울 사무실 02-123-4567, 고객센터 1588-1234, 휴대폰 01098765432.",
     "서울 사무실 <PHONE>, 고객센터 <PHONE>, 휴대폰 <PHONE>.", (0, 3, 0)),
    ("(02) 3456-7890 으로 전화 주시고 031.765.4321 팩스도 확인해 주세요.",
     "<PHONE> 으로 전화 주시고 <PHONE> 팩스도 확인해 주세요.", (0, 2, 0)),
    ("카드번호:4111 1111 1111 1111 로 결제했는데 취소가 안 돼요.",
     "카드번호:<CARD> 로 결제했는데 취소가 안 돼요.", (0, 0, 1)),
    ("결제 카드 5555-5555-5555-4444, 연락처 010 2222 3333, 메일 hong@example.kr",
     "결제 카드 <CARD>, 연락처 <PHONE>, 메일 <EMAIL>", (1, 1, 1)),
]

# Text that must survive untouched: dates, versions, prices, times, ids, numbers that fail Luhn.
NEGATIVE = [
    "Released on 2024-01-15 (also written 2024.01.15 or 01/15/2024).",
    "2024년 1월 15일 오후 3시에 배포했습니다.",
    "We run vLLM v0.32.0 on Python 3.11.4 with torch 2.13.0.",
    "Upgrade from 1.2.3.4 to 10.20.30 before Friday.",
    "The server at 192.168.100.1 answers on port 8080.",
    "The laptop costs $1,299.99 and the monitor €349.90.",
    "가격은 12,000원이고 연간 요금은 ₩1,234,567입니다.",
    "Revenue grew to 1,234,567,890 won in Q3.",
    "The meeting runs 10:30-11:45 in room 301-B.",
    "Order #2024-0042 ships with ISBN 978-3-16-148410-0.",
    "Not a card (fails Luhn): 1234 5678 9012 3456.",
    "Tracking number 10000000000000 is still in transit.",
    "pi is about 3.14159265358979323846.",
    "Latency p99 went from 120 ms to 95 ms (-20.8%).",
    "Use an email-like string without a domain: user@localhost.",
    "2019-2024 sales: 1500, 1720, 1910, 2300, 2650, 3100.",
]


# Personal data glued to Korean text (no spaces around it) and the other common formats.
GLUED = [
    ("연락처는010-1234-5678입니다", "연락처는<PHONE>입니다", (0, 1, 0)),
    ("휴대폰01012345678로 연락주세요", "휴대폰<PHONE>로 연락주세요", (0, 1, 0)),
    ("해외번호+82 10 1234 5678로 부탁해요", "해외번호<PHONE>로 부탁해요", (0, 1, 0)),
    ("사무실은02-123-4567번입니다", "사무실은<PHONE>번입니다", (0, 1, 0)),
    ("대표번호1588-1234로 전화", "대표번호<PHONE>로 전화", (0, 1, 0)),
    ("문의는jane.kim@example.co.kr로 보내세요", "문의는<EMAIL>로 보내세요", (1, 0, 0)),
    ("카드4111-1111-1111-1111로 결제", "카드<CARD>로 결제", (0, 0, 1)),
    ("카드번호는4111 1111 1111 1111이고 유효기간은 12/27", "카드번호는<CARD>이고 유효기간은 12/27", (0, 0, 1)),
    ("결제카드5555555555554444였어요", "결제카드<CARD>였어요", (0, 0, 1)),
    ("아멕스3782-822463-10005사용", "아멕스<CARD>사용", (0, 0, 1)),
    ("고객(010-9876-5432, hong@example.kr)님", "고객(<PHONE>, <EMAIL>)님", (1, 1, 0)),
    # English formats
    ("Text me on +44 7700 900481 tonight.", "Text me on <PHONE> tonight.", (0, 1, 0)),
    ("London office: +44 (0)20 7946 0958.", "London office: <PHONE>.", (0, 1, 0)),
    ("Dial 1-415-555-0132 or 1 (415) 555-0132.", "Dial <PHONE> or <PHONE>.", (0, 2, 0)),
    ("Her number is 415 555 0132.", "Her number is <PHONE>.", (0, 1, 0)),
    ("Card: 4012-8888-8888-1881 exp 09/28", "Card: <CARD> exp 09/28", (0, 0, 1)),
]


@pytest.mark.parametrize("text, expected, counts", GLUED)
def test_scrub_finds_data_glued_to_korean_and_other_formats(text: str, expected: str, counts: tuple[int, int, int]) -> None:
    out, found = scrub_text(text)
    assert out == expected
    assert (found.email, found.phone, found.card) == counts


@pytest.mark.parametrize("text", [
    "Scores were 100 200 3000 across the three runs.",
    "카드 4111-1111-1111-1112는 체크섬이 틀린 번호입니다",  # fails Luhn
    "2024년12월31일까지 접수",
])
def test_scrub_leaves_number_lists_and_bad_checksums_alone(text: str) -> None:
    assert scrub_text(text) == (text, ScrubCounts())


@pytest.mark.parametrize("text, expected, counts", POSITIVE)
def test_scrub_replaces_personal_data(text: str, expected: str, counts: tuple[int, int, int]) -> None:
    out, found = scrub_text(text)
    assert out == expected
    assert (found.email, found.phone, found.card) == counts
    assert found.total == sum(counts)


@pytest.mark.parametrize("text", NEGATIVE)
def test_scrub_leaves_dates_versions_prices_alone(text: str) -> None:
    out, found = scrub_text(text)
    assert out == text
    assert found == ScrubCounts()


@pytest.mark.parametrize(
    "digits, ok",
    [
        ("4111111111111111", True),
        ("378282246310005", True),
        ("5555555555554444", True),
        ("4111111111111112", False),
        ("1234567890123456", False),
    ],
)
def test_luhn(digits: str, ok: bool) -> None:
    assert luhn_ok(digits) is ok


def test_card_digits_glued_to_letters_are_not_cards() -> None:
    text = "build id A4111111111111111 and sha 4111111111111111abc"
    assert scrub_text(text) == (text, ScrubCounts())


def test_scrub_messages_counts_over_messages_and_keeps_roles() -> None:
    messages = [
        {"role": "system", "content": "You handle refunds. Escalations go to refunds@example.com."},
        {"role": "user", "content": "환불 부탁드려요. 카드 4111 1111 1111 1111, 연락처 010-1234-5678."},
    ]
    out, counts = scrub_messages(messages)
    assert [m["role"] for m in out] == ["system", "user"]
    assert out[0]["content"] == "You handle refunds. Escalations go to <EMAIL>."
    assert out[1]["content"] == "환불 부탁드려요. 카드 <CARD>, 연락처 <PHONE>."
    assert counts == ScrubCounts(email=1, phone=1, card=1)
    assert messages[1]["content"].startswith("환불 부탁드려요. 카드 4111")  # input not modified
