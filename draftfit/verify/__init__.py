"""`draftfit verify`: real vLLM runs beside the predictions of a `rank` run.

The package, by step: :mod:`~draftfit.verify.selection` (what to measure),
:mod:`~draftfit.verify.load` (load generation), :mod:`~draftfit.verify.latency` (latency
statistics), :mod:`~draftfit.verify.measure` (how each configuration is reached, and the rounds),
:mod:`~draftfit.verify.rounds` (medians and bootstrap intervals over rounds),
:mod:`~draftfit.verify.comparison` (measured beside predicted, flags) and
:mod:`~draftfit.verify.run` (orchestration); the servers are
:class:`draftfit.engines.vllm_server.VLLMServer` (default) or
:class:`draftfit.engines.vllm_async.AsyncVLLMEngine` (``--engine inprocess``).

For a results file, verify runs vLLM **without speculation** (the baseline) and with each chosen
configuration (candidate, k) — each its own ``vllm serve`` on localhost, in interleaved rounds —
on the same sampled prompts and sampling parameters as `rank`, at each concurrency level, and
records what it measured:

* TTFT, ITL and end-to-end latency (mean, p50, p95, p99) and output tokens per second;
* vLLM's own spec-decode counters (drafts, draft tokens, accepted, accepted per position), read
  before and after each run and differenced, turned into AL, acceptance rate and per-position
  rates by :class:`draftfit.metrics.SpecCounts` (vLLM's definitions);
* failed and timed-out requests; peak memory (RSS of the engine's processes; device memory
  used, where there is a GPU).

How requests are issued: through the server's OpenAI-compatible streaming API (continuous usage
stats count the tokens of each chunk), or ``RequestOutputKind.DELTA`` outputs of an in-process
``AsyncLLM``, with an ``asyncio.Semaphore`` of size C holding C requests in flight; the time each
streamed output reaches draftfit is recorded.
Before each run the prefix cache is reset, so no run reuses another's prefill; one short
warm-up request runs once after start-up. Every run is bounded: ``requests`` requests, and a
time limit after which unfinished requests are aborted and counted as errors.

Definitions (each number in results says ``measured``, ``predicted`` or ``error``):

* TTFT: from sending a request to its first output token.
* ITL (draftfit's and the cost model's definition, "time per output token"): with speculation
  one engine step can stream several tokens at once; each token of a streamed chunk is given
  the chunk's gap / its token count. The mean ITL is Σ(last − first token time) / Σ(tokens − 1)
  over requests; it is what ``itl_*_predicted`` (= step time / AL) predicts, and
  ``speedup_measured`` = the median over rounds of baseline mean ITL / configuration mean ITL at
  the same concurrency in the same round, with a bootstrap 95% interval.
* Stream gap: the time between successive streamed chunks of a request — what ``vllm bench
  serve`` calls ITL. Recorded beside ITL, not used for flags.
* Output tok/s: output tokens of the run / the run's wall time (first send to last finish).

Roll-out flags (per entry, and summarized): slower than the baseline (measured speedup < 1),
lower throughput, p95 or p99 ITL worse than the baseline's, errors, a suspected engine fault.

Engine sanity: a measured acceptance far outside the range the prediction allows — above all a
draft that *is* the target, which must be accepted every time under greedy decoding or
probabilistic drafting — is reported as a suspected engine fault (``engine_fault``), and such
entries are left out of prediction-error figures.
"""

