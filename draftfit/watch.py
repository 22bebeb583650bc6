"""`draftfit watch`: a live vLLM server held against the prediction for the configuration it runs.

Every interval it scrapes the server's /metrics and differences it from the first scrape: vLLM's
spec-decode counters give the AL and the per-position acceptance since the watch began; the
time-per-output-token histogram (one observation per finished request: its decode time over its
tokens after the first — draftfit's ITL, per request) the mean ITL and its p50/p95 (Prometheus'
bucket interpolation); the running-requests gauge the concurrency the server actually saw. vLLM's
``inter_token_latency`` histogram is shown as the step gap: it observes once per request and
engine step, and a speculative step emits several tokens, so it is not a per-token latency. The prediction is the
one `rank` made for that configuration, interpolated to the observed concurrency; for a deploy
command with a k schedule by batch size, that of the k the schedule runs at the observed
concurrency (rounded), and none where the schedule switches speculation off. Drift is
reported — and the command exits non-zero — when, with enough traffic to judge, the measured AL
lies below the predicted range (CI and bounds: acceptance sliding toward 1) or the mean ITL lies
above the slowest predicted ITL (the speedup interval's low end): slower than predicted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftfit import results as results_mod
from draftfit.deploy import k_at
from draftfit.errors import DraftfitError
from draftfit.metrics import ServerMetrics
from draftfit.records import ConfigEntry
from draftfit.verify.selection import Schedule, config_label, deployed_k, parse_config

MIN_DRAFTS = 50  # drafting steps before the AL is judged
MIN_REQUESTS = 5  # finished requests (TPOT observations) before the ITL is judged
DRIFT_EXIT = 3  # the exit code of a drift (2: an error, as every draftfit command)


@dataclass(frozen=True)
class Expected:
    """What `rank` predicted for the deployed configuration at one concurrency (interpolated)."""

    candidate: str
    k: int
    concurrency: float
    al: float
    al_low: float
    al_high: float
    per_position: list[float]
    itl_ms: float
    itl_ms_slowest: float  # the ITL at the speedup interval's low end

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "predicted", **self.__dict__}


@dataclass(frozen=True)
class Deployed:
    """The configuration a server runs: a candidate at one k, or rank's deploy command with its k
    schedule by batch size. ``k`` is its ``num_speculative_tokens`` (the positions of the server's
    counters); ``configs`` holds rank's configuration of every k it runs."""

    candidate: str
    k: int
    configs: dict[int, ConfigEntry]
    schedule: Schedule | None = None

    @classmethod
    def one(cls, config: ConfigEntry) -> Deployed:
        return cls(config["candidate"], int(config["k"]), {int(config["k"]): config})

    @property
    def label(self) -> str:
        return config_label(self.candidate, self.k, self.schedule)

    def k_running(self, concurrency: float) -> int:
        """The k served at ``concurrency`` (the schedule's at the nearest batch size; 0: off)."""
        return k_at(self.schedule, max(1, round(concurrency))) if self.schedule else self.k

    def expected(self, concurrency: float) -> Expected | None:
        """The prediction at ``concurrency``; None where the schedule switches speculation off (rank
        writes that step's cost, itl_off_ms_predicted, but no interval to hold a server to)."""
        k = self.k_running(concurrency)
        return expected_at(self.configs[k], concurrency) if k else None


def deployed_config(results: results_mod.Results, name: str | None) -> Deployed:
    """The configuration the server runs: ``NAME:K``, or rank's recommended deploy command (its k
    schedule by batch size included)."""
    schedule = None
    if name:
        candidate, k = parse_config(name)
    else:
        deployed = deployed_k(results)
        if deployed is None:
            raise DraftfitError("the results recommend no configuration", fix="Name the deployed one with --config NAME:K")
        candidate, (k, schedule) = results.recommendation["candidate"], deployed
    ks = sorted({r[2] for r in schedule if r[2]}) if schedule else [k]
    configs = {int(c["k"]): c for c in results.configs if c["candidate"] == candidate and c["k"] in ks}
    missing = [f"{candidate} k={k}" for k in ks if k not in configs]
    if missing:
        raise DraftfitError(f"no configuration {', '.join(missing)} in the results", fix="Use --config NAME:K from the ranking")
    return Deployed(candidate, int(k), configs, schedule)


def expected_at(config: dict[str, Any], concurrency: float) -> Expected:
    """The prediction at ``concurrency``: ITL and speedup interval interpolated linearly between
    the study's levels (clamped at its ends); acceptance does not depend on concurrency."""
    levels = sorted(config["per_concurrency"], key=lambda level: level["concurrency"])
    xs = np.asarray([level["concurrency"] for level in levels], float)
    c = float(min(max(concurrency, xs[0]), xs[-1]))

    def at(key: str) -> float:
        return float(np.interp(c, xs, np.asarray([level[key] for level in levels], float)))

    itl = at("itl_spec_ms_predicted")
    slowest = itl * at("speedup_predicted") / at("speedup_ci_low")
    return Expected(
        candidate=config["candidate"], k=int(config["k"]), concurrency=float(concurrency),
        al=float(config["al_predicted"]),
        al_low=float(min(config["al_ci_low"], config.get("al_bound_low", config["al_ci_low"]))),
        al_high=float(max(config["al_ci_high"], config.get("al_bound_high", config["al_ci_high"]))),
        per_position=[float(v) for v in config.get("per_position_predicted") or []],
        itl_ms=itl, itl_ms_slowest=slowest,
    )


@dataclass
class Watch:
    """The watch's state: the first scrape, the running-requests samples, and every observation."""

    deployed: Deployed
    first: ServerMetrics | None = None
    running: list[float] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)

    def observe(self, scrape: ServerMetrics, now: float) -> dict[str, Any]:
        """One scrape → the measured figures since the first scrape, the prediction, the verdict."""
        if self.first is None:
            self.first = scrape
        if scrape.running > 0:
            self.running.append(scrape.running)
        since = scrape - self.first
        concurrency = float(np.mean(self.running)) if self.running else 0.0
        expected = self.deployed.expected(max(concurrency, 1.0))
        counts = since.counts
        measured: dict[str, Any] = {"kind": "measured", "concurrency": concurrency, "requests_running": scrape.running,
                                    "requests_waiting": scrape.waiting}
        problems: list[str] = []
        served = scrape.counts  # since the server started: its k shows before this watch sees traffic
        positions = len(served.accepted_per_pos) if served is not None and served.num_drafts else 0
        if positions and positions != self.deployed.k:
            problems.append(f"the server drafts {positions} tokens per step, not k={self.deployed.k}: it runs another "
                            "configuration (name it with --config NAME:K)")
        if counts is not None and counts.num_drafts:
            measured.update(al=counts.mean_acceptance_length, drafts=int(counts.num_drafts),
                            per_position=[float(v) for v in counts.per_position_rate])
            if expected is not None and counts.num_drafts >= MIN_DRAFTS and counts.mean_acceptance_length < expected.al_low:
                problems.append(f"AL {counts.mean_acceptance_length:.2f} below the predicted range "
                                f"[{expected.al_low:.2f}, {expected.al_high:.2f}]: acceptance is sliding toward 1 "
                                "(traffic unlike the sampled prompts, or another draft)")
        elif counts is None:
            problems.append("the server reports no spec-decode counters: it runs without speculation")
        tpot, gap = since.tpot, since.itl
        if gap.count:
            measured.update(step_gap_p50_ms=_ms(gap.quantile(0.5)), step_gap_p95_ms=_ms(gap.quantile(0.95)))
        if tpot.count:
            measured.update(itl_ms=1000.0 * tpot.mean, itl_p50_ms=_ms(tpot.quantile(0.5)), itl_p95_ms=_ms(tpot.quantile(0.95)),
                            requests_finished=int(tpot.count))
            if expected is not None and tpot.count >= MIN_REQUESTS and 1000.0 * tpot.mean > expected.itl_ms_slowest:
                problems.append(f"mean ITL {1000.0 * tpot.mean:.1f} ms above the slowest predicted {expected.itl_ms_slowest:.1f} ms "
                                f"at concurrency {concurrency:.1f}: slower than predicted")
        predicted = expected.to_dict() if expected is not None else {
            "kind": "predicted", "k": 0, "concurrency": concurrency,
            "note": "the k schedule switches speculation off at this concurrency: not judged (no predicted interval)"}
        observation = {"time": now, "measured": measured, "predicted": predicted, "drift": problems}
        self.observations.append(observation)
        return observation

    def summary(self) -> dict[str, Any]:
        last = self.observations[-1] if self.observations else {}
        return {"kind": "measured", "config": self.deployed.label,
                "observations": self.observations, "drift": last.get("drift", []),
                "thresholds": {"min_drafts": MIN_DRAFTS, "min_requests": MIN_REQUESTS}}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def format_observation(observation: dict[str, Any]) -> str:
    m, p = observation["measured"], observation["predicted"]

    def num(value, spec=".2f") -> str:
        return "—" if value is None else f"{value:{spec}}"

    if "al" not in p:  # a k schedule's "off" range: nothing predicted to hold the server to
        line = (f"C {m['concurrency']:.1f} | AL {num(m.get('al'))} | ITL {num(m.get('itl_ms'), '.1f')} ms "
                f"| {p.get('note', 'not predicted')} | drafts {m.get('drafts', 0)} requests {m.get('requests_finished', 0)}")
    else:
        line = (f"C {m['concurrency']:.1f} | AL {num(m.get('al'))} (pred. k={p['k']}: {p['al']:.2f} [{p['al_low']:.2f},{p['al_high']:.2f}]) "
                f"| ITL {num(m.get('itl_ms'), '.1f')} ms p50 {num(m.get('itl_p50_ms'), '.0f')} p95 {num(m.get('itl_p95_ms'), '.0f')} "
                f"(pred. {p['itl_ms']:.1f}, slowest {p['itl_ms_slowest']:.1f}) | step gap p50 {num(m.get('step_gap_p50_ms'), '.0f')} "
                f"| drafts {m.get('drafts', 0)} requests {m.get('requests_finished', 0)}")
        if m.get("per_position"):
            line += " | per pos " + " ".join(f"{v:.2f}" for v in m["per_position"]) + " (pred. " + " ".join(
                f"{v:.2f}" for v in p["per_position"]) + ")"
    return line + ("".join(f"\n  DRIFT: {d}" for d in observation["drift"]))


def run_watch(url: str, results: results_mod.Results, *, config: str | None, interval_s: float, duration_s: float,
              show: Callable[[dict[str, Any]], None], save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Scrape ``url`` every ``interval_s`` for ``duration_s``; ``show``/``save`` each observation's state."""
    import asyncio

    from draftfit.engines.vllm_server import ServerClient

    watch = Watch(deployed_config(results, config))

    async def loop() -> None:
        async with ServerClient(url) as client:
            end = time.monotonic() + duration_s
            while True:
                observation = watch.observe(await client.metrics(), time.time())
                show(observation)
                save(watch.summary())
                if time.monotonic() + interval_s > end:
                    return
                await asyncio.sleep(interval_s)

    asyncio.run(loop())
    return watch.summary()
