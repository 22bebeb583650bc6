"""The records that cross modules in ``results.json``: a configuration's predictions, its entry at
one concurrency level, and a measured entry of `verify`.

They are TypedDicts, so the JSON file, the report, the notebook and the CSV read them as the plain
mappings they are, while pydantic checks them on save and load (unknown keys are refused: a typo in a
writer fails the writer's tests, not a reader's). Every number's key says what it is: ``*_predicted``,
``*_measured``, ``*_bound_*``, ``*_ci_*`` or ``*_error``.

A level entry holds only what changes with concurrency; what belongs to the configuration (its
candidate, k, AL, fit, rank) is read from the configuration (:func:`flat_level`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field
from typing_extensions import TypedDict

_FORBID = ConfigDict(extra="forbid")
Num = float | None  # a computed number; JSON null where it is undefined (written from NaN)


def _(description: str) -> Any:
    return Field(description=description)


class _SpeedPredicted(TypedDict, total=False):
    """Predicted speed at one concurrency level (a level entry; a measured entry's prediction)."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]

    speedup_predicted: Annotated[Num, _("Predicted baseline ITL / this ITL.")]
    speedup_ci_low: Annotated[Num, _("Speedup at the low end of the AL interval.")]
    speedup_ci_high: Annotated[Num, _("Speedup at the high end of the AL interval.")]
    itl_base_ms_predicted: Annotated[Num, _("Predicted mean ITL without speculation, ms (prefill stall included).")]
    tok_s_aggregate_predicted: Annotated[Num, _("Predicted output tokens per second of all requests in flight.")]


class _AcceptancePredicted(TypedDict, total=False):
    """Predicted acceptance of a configuration (a config entry; a measured entry's prediction)."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]

    rule: Annotated[str | None, _("The acceptance rule: greedy, greedy-draft or probabilistic.")]
    exact: Annotated[bool | None, _("Whether acceptance is exact (else top-K bounds apply).")]
    al_predicted: Annotated[Num, _("Predicted mean acceptance length, vLLM's definition (1 + accepted/drafts).")]
    al_ci_low: Annotated[Num, _("95% bootstrap interval over prompts, low end.")]
    al_ci_high: Annotated[Num, _("95% bootstrap interval over prompts, high end.")]
    al_bound_low: Annotated[Num, _("Lowest AL the top-K logprobs allow.")]
    al_bound_high: Annotated[Num, _("Highest AL the top-K logprobs allow.")]
    acceptance_rate_predicted: Annotated[Num, _("Predicted accepted / draft tokens (falls with k: never compare across k).")]
    latency_source: Annotated[str | None, _("Where step times came from (measured profile or roofline).")]


class LevelEntry(_SpeedPredicted, total=False):
    """A configuration's predictions at one concurrency level (``configs[].per_concurrency[]``)."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]

    concurrency: Annotated[int, _("Requests in flight.")]
    itl_spec_ms_predicted: Annotated[Num, _("Predicted mean ITL of this configuration, ms (prefill stall included).")]
    prefill_stall_base_ms_predicted: Annotated[Num, _("Predicted per-token wait for other requests' prefills, baseline, ms.")]
    prefill_stall_spec_ms_predicted: Annotated[Num, _("The same with speculation (the draft prefills too), ms.")]
    prefill_base_ms_predicted: Annotated[list[Num], _("What each sampled prompt's prefill adds to the plain step it rides in, ms (sample order): "
                                                      "the stall is (concurrency − 1) × their mean / the mean answer length.")]
    prefill_spec_ms_predicted: Annotated[list[Num], _("The same for a speculative step (the draft's own prefill included), ms.")]
    tok_s_per_seq_predicted: Annotated[Num, _("Predicted output tokens per second of one request.")]
    itl_off_ms_predicted: Annotated[Num, _("Predicted mean ITL where a k schedule of this candidate is off (k = 0) at this level, "
                                           "ms: vLLM still runs a draft model's first pass each step (none model-free).")]
    speedup_off_predicted: Annotated[Num, _("Baseline ITL / itl_off_ms_predicted.")]
    al_measured: Annotated[Num, _("Copied from `verify`'s entry at this level: vLLM's mean acceptance length.")]
    speedup_measured: Annotated[Num, _("Copied from `verify`'s entry: measured baseline ITL / this ITL.")]
    itl_p50_ms_measured: Annotated[Num, _("Copied from `verify`'s entry: measured median ITL, ms.")]
    speedup_ci_low_measured: Annotated[Num, _("Copied from `verify`'s entry: bootstrap 95% interval of the speedup, low.")]
    speedup_ci_high_measured: Annotated[Num, _("Copied from `verify`'s entry: bootstrap 95% interval of the speedup, high.")]
    verify_id_measured: Annotated[str | None, _("The verify run the measured figures come from (the last one).")]


class ConfigEntry(_AcceptancePredicted, total=False):
    """One (candidate, k) with everything predicted for it (``configs[]``)."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]

    candidate: Annotated[str, _("The candidate file's name.")]
    method: Annotated[str, _("The draft method (draftfit.methods).")]
    draft: Annotated[str | None, _("What the vLLM config names as the draft model (None: model-free).")]
    k: Annotated[int, _("Speculative tokens per step.")]
    kind: Annotated[str, _("`predicted`.")]
    fits: Annotated[bool, _("Whether target + draft fit in the deployment's memory at the study's concurrency.")]
    tokens_per_step_predicted: Annotated[Num, _("Useful tokens per decode step over all steps (steps without a proposal included).")]
    draft_step_fraction_predicted: Annotated[Num, _("Share of decode steps that carry drafts.")]
    counts_predicted: Annotated[dict[str, Any], _("Predicted vLLM spec-decode counters (draftfit.metrics.SpecCounts).")]
    per_prompt_predicted: Annotated[dict[str, list[Num]], _("Predicted counters per prompt, in sample order.")]
    per_position_predicted: Annotated[list[Num], _("Predicted marginal acceptance rate per draft position.")]
    conditional_predicted: Annotated[list[Num], _("Predicted conditional acceptance rate per draft position.")]
    segments_predicted: Annotated[dict[str, dict[str, Any]], _("Predicted AL per input-length bucket and prompt category.")]
    extra_vram_gib: Annotated[Num, _("Predicted extra device memory of the draft, GiB.")]
    vram: Annotated[dict[str, Any] | None, _("The VRAM report (draftfit.vram), None for a model-free method.")]
    break_even: Annotated[dict[str, Any], _("Where speculation stops paying as concurrency rises.")]
    per_concurrency: Annotated[list[LevelEntry], _("The predictions at each concurrency level.")]
    cost: Annotated[dict[str, Any], _("The step-model terms used (draft, target, context length).")]
    rank: Annotated[int | None, _("Place in the ranking (None: does not fit).")]
    pareto: Annotated[bool, _("On the Pareto front of speedup vs extra VRAM.")]
    rank_reason: Annotated[str, _("Why the configuration sits where it does.")]


class MeasuredEntry(_AcceptancePredicted, _SpeedPredicted, total=False):
    """One (candidate, k, concurrency) measured by `verify`, the prediction beside it (``measured[]``).
    ``candidate`` None is the no-speculation baseline."""

    __pydantic_config__ = _FORBID  # type: ignore[misc]

    kind: Annotated[str, _("`measured`.")]
    verify_id: Annotated[str, _("The verify run that measured it.")]
    candidate: Annotated[str | None, _("The candidate (None: the baseline).")]
    k: Annotated[int | None, _("Speculative tokens per step (None: the baseline; with a schedule, its largest).")]
    schedule: Annotated[list[list[int]] | None,
                        _("A k schedule by batch size ([start, end, k] ranges; rank's deploy command), or None: one k.")]
    k_predicted: Annotated[int, _("With a schedule: the k it runs at this concurrency, whose prediction stands beside.")]
    method: Annotated[str | None, _("The draft method.")]
    draft: Annotated[str | None, _("The draft's local directory (model drafts).")]
    speculative_config: Annotated[dict[str, Any] | None, _("The speculative_config the engine ran.")]
    draft_is_target: Annotated[bool, _("The draft is the target itself (must always be accepted).")]
    concurrency: Annotated[int, _("Requests in flight.")]
    engine_failed: Annotated[bool, _("The engine did not start or died.")]
    error: Annotated[str | None, _("Why the engine failed.")]
    startup_s: Annotated[Num, _("Engine start-up, measured seconds.")]
    requests: Annotated[int, _("Requests sent (over every round).")]
    requests_per_run: Annotated[int, _("Requests of one run (one round at one level).")]
    completed: Annotated[int, _("Requests completed.")]
    errors: Annotated[int, _("Requests failed or timed out.")]
    error_messages: Annotated[list[str], _("Distinct request errors.")]
    finish_reasons: Annotated[dict[str, int], _("Finish reasons and their counts.")]
    prompts_sent: Annotated[int, _("How many of the sampled prompts were sent.")]
    output_tokens_measured: Annotated[int, _("Output tokens of the run.")]
    duration_s_measured: Annotated[Num, _("Wall time, first send to last finish, s.")]
    output_tok_s_measured: Annotated[Num, _("Output tokens per second of the run.")]
    mean_in_flight_measured: Annotated[Num, _("Mean requests in flight.")]
    ttft_ms_measured: Annotated[dict[str, Any], _("Time to first token, ms: mean and percentiles.")]
    itl_ms_measured: Annotated[dict[str, Any], _("Inter-token latency, ms: mean and percentiles.")]
    stream_gap_ms_measured: Annotated[dict[str, Any], _("Gap between streamed chunks, ms (vllm bench serve's ITL).")]
    e2e_ms_measured: Annotated[dict[str, Any], _("End-to-end latency, ms.")]
    memory_measured: Annotated[dict[str, Any], _("Peak memory of the engine's processes or device.")]
    machine_load_measured: Annotated[list[dict[str, Any]] | dict[str, Any] | None,
                                     _("The machine's load around each round's run: load average, CPU steal share.")]
    group: Annotated[int, _("The group of configurations measured beside one baseline, in interleaved rounds.")]
    rounds: Annotated[int, _("Interleaved rounds measured (the same prompts each round).")]
    prompts_hash: Annotated[str, _("The prompt set sent (SHA-256 of the token ids), as `rank`'s.")]
    serve_argv: Annotated[list[str] | None, _("The `vllm serve` command that ran (the server path).")]
    server_url: Annotated[str | None, _("Where the server listened (localhost) or the --server URL.")]
    server_state: Annotated[str | None, _("A method drafting from earlier requests (suffix): its server was `fresh every run`, or its state `carried over` (a --server URL).")]
    prompt_token_mismatches: Annotated[int, _("Requests whose prompt the server counted in other tokens than `rank`'s.")]
    output_tok_s_rounds_measured: Annotated[list[Num | None], _("Output tok/s of each round.")]
    itl_rounds_measured: Annotated[dict[str, Any], _("Mean ITL per round, their median and its bootstrap 95% interval, ms.")]
    al_rounds_measured: Annotated[list[Num | None], _("vLLM's AL in each round.")]
    speedup_ci_low_measured: Annotated[Num, _("Bootstrap 95% interval of the speedup (median over rounds), low.")]
    speedup_ci_high_measured: Annotated[Num, _("Bootstrap 95% interval of the speedup (median over rounds), high.")]
    speedup_rounds_measured: Annotated[list[Num | None], _("Baseline ITL / this ITL in each interleaved round.")]
    rounds_disagree: Annotated[bool, _("A round lies outside the bootstrap interval: the machine's speed moved.")]
    baseline_ref: Annotated[dict[str, Any], _("The baseline the speedup divides by: run, group, requests, rounds, prompts, ITL.")]
    counts_measured: Annotated[dict[str, Any] | None, _("vLLM's spec-decode counters, differenced around the run.")]
    al_measured: Annotated[Num, _("vLLM's mean acceptance length.")]
    acceptance_rate_measured: Annotated[Num, _("vLLM's accepted / draft tokens.")]
    per_position_measured: Annotated[list[Num], _("vLLM's marginal acceptance rate per position.")]
    conditional_measured: Annotated[list[Num], _("Conditional acceptance rate per position.")]
    speedup_measured: Annotated[Num, _("Median over rounds of baseline mean ITL / this mean ITL (same concurrency, same round).")]
    throughput_ratio_measured: Annotated[Num, _("This output tok/s / the baseline's.")]
    baseline_verify_id: Annotated[str | None, _("The verify run whose baseline the speedup divides by.")]
    engine_fault: Annotated[str | None, _("A suspected engine fault: why the acceptance is outside what is possible.")]
    flags: Annotated[list[str], _("Roll-out flags (verify.ROLLOUT_FLAGS).")]
    # the prediction beside it (verify.predicted_level), for the prompts sent
    itl_ms_predicted: Annotated[Num, _("Predicted mean ITL, ms.")]
    prompts_predicted: Annotated[int, _("Prompts the prediction was restricted to.")]
    al_predicted_all_prompts: Annotated[Num, _("Predicted AL over every sampled prompt.")]
    speedup_predicted_all_prompts: Annotated[Num, _("Predicted speedup over every sampled prompt.")]
    itl_error: Annotated[Num, _("(predicted − measured) / measured mean ITL.")]
    al_error: Annotated[Num, _("(predicted − measured) / measured AL.")]
    speedup_error: Annotated[Num, _("(predicted − measured) / measured speedup.")]
    tok_s_error: Annotated[Num, _("(predicted − measured) / measured output tok/s.")]


# What a level entry reads from its configuration (schema 1 repeated these in every level).
PARENT_KEYS = ("candidate", "method", "draft", "k", "fits", "al_predicted", "al_ci_low", "al_ci_high", "al_bound_low",
               "al_bound_high", "acceptance_rate_predicted", "extra_vram_gib", "latency_source", "rank", "pareto")


def flat_level(config: ConfigEntry, level: LevelEntry) -> dict[str, Any]:
    """A level entry with the configuration's own fields beside it (the CSV's row, a table's cell)."""
    return {**{key: config[key] for key in PARENT_KEYS if key in config}, **level}  # type: ignore[literal-required]
