"""Latency statistics of one run: the per-request records and their summary (TTFT, ITL, stream
gap, end-to-end: mean and percentiles; tokens per second)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


PERCENTILES = (50, 95, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it (``time.perf_counter`` seconds)."""

    index: int
    prompt_index: int
    start: float | None = None  # sent (after the concurrency slot was free)
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed output with tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in it
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None  # the prompt's length as the server counted it (server runs)

    @property
    def tokens(self) -> int:
        return int(sum(self.chunk_tokens))


def distribution(values: Any) -> dict[str, float | int | None]:
    """mean, p50, p95, p99 (linear interpolation) and n; None where there are no values."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return {"n": 0, "mean": None, **{f"p{q}": None for q in PERCENTILES}}
    pct = np.percentile(arr, PERCENTILES)
    return {"n": int(arr.size), "mean": float(arr.mean()), **{f"p{q}": float(v) for q, v in zip(PERCENTILES, pct, strict=True)}}


def latency_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFT, ITL, stream gaps, end-to-end latency (ms), output tokens and tok/s of one run (measured)."""
    ok = [r for r in records if r.error is None and r.start is not None and r.end is not None]
    sent = [r for r in records if r.start is not None]
    ttft, e2e, itl, gaps = [], [], [], []
    decode_s = 0.0
    decode_tokens = 0
    for r in ok:
        e2e.append(r.end - r.start)
        if not r.chunk_times:
            continue
        t = np.asarray(r.chunk_times, dtype=np.float64)
        n = np.asarray(r.chunk_tokens, dtype=np.int64)
        ttft.append(t[0] - r.start)
        gap = np.diff(t)
        gaps.append(gap)
        # every token after the first: a later chunk's tokens share its gap; extra tokens of the
        # first chunk arrived with the first token (gap 0)
        itl.append(np.concatenate([np.zeros(int(n[0]) - 1), np.repeat(gap / n[1:], n[1:])]))
        decode_s += float(t[-1] - t[0])
        decode_tokens += int(n.sum()) - 1
    output_tokens = int(sum(r.tokens for r in records))
    duration = (max(r.end for r in sent if r.end is not None) - min(r.start for r in sent)) if sent and any(r.end for r in sent) else 0.0
    ms = lambda parts: 1000.0 * (np.concatenate(parts) if parts else np.zeros(0))  # noqa: E731
    itl_ms = distribution(ms(itl))
    # the mean ITL is token-weighted over requests: decode time / decode tokens
    itl_ms["mean"] = 1000.0 * decode_s / decode_tokens if decode_tokens else None
    return {
        "requests": len(records),
        "completed": len(ok),
        "errors": sum(r.error is not None for r in records),
        "error_messages": sorted({r.error for r in records if r.error})[:5],
        "output_tokens": output_tokens,
        "duration_s": float(duration),
        "output_tok_s": output_tokens / duration if duration > 0 else None,
        "mean_in_flight": float(sum(r.end - r.start for r in sent if r.end is not None) / duration) if duration > 0 else None,
        "ttft_ms": distribution(1000.0 * np.asarray(ttft)),
        "itl_ms": itl_ms,
        "stream_gap_ms": distribution(ms(gaps)),
        "e2e_ms": distribution(1000.0 * np.asarray(e2e)),
        "finish_reasons": {reason: sum(r.finish_reason == reason for r in ok) for reason in sorted({str(r.finish_reason) for r in ok})},
    }
