"""`draftfit verify RESULTS.json --top N`."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import click

from draftfit.candidates import Dtype
from draftfit.cli.options import int_list, show_prompts, trust_remote_code

VERIFY_FAILED = 1  # some run measured nothing (2: a usage or input error, as every draftfit command)


@click.command("verify")
@click.argument("results_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--top", type=click.IntRange(min=1), help="Verify the first N configurations of the ranking. Default 3 when nothing else is chosen.")
@click.option("--recommended", is_flag=True, default=None,
              help="Verify rank's recommended deploy command exactly, its k schedule by batch size included. Default: "
                   "with the top 3 when nothing else is chosen.")
@click.option("--config", "configs", multiple=True, metavar="NAME:K",
              help="Verify candidate NAME (from the results) with k=K. Repeatable.")
@click.option("--candidate", "candidate_files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Verify a candidate file (same target), e.g. a method `rank` cannot score. Repeatable.")
@click.option("--k", "ks", callback=int_list, help="k values for --candidate files, e.g. 2,4. Default: each file's own k list.")
@click.option("--concurrency", callback=int_list, help="Concurrency levels, e.g. 1,4,8. Default: the study's levels.")
@click.option("--requests", type=click.IntRange(min=1), help="Requests per run (prompts are reused in order). Default: one per sampled prompt.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=900.0, show_default=True,
              help="Seconds per (configuration, concurrency) run; unfinished requests are aborted and counted as errors.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(min=0, min_open=True, max=1),
              help="Memory fraction of the engines started here. Default: the study's engine memory fraction.")
@click.option("--dtype", type=click.Choice(typing.get_args(Dtype)),
              help="The engines' dtype (auto: bfloat16 where the hardware computes it, else float32). Default: the study's, "
                   "as `rank` ran.")
@click.option("--engine", type=click.Choice(["serve", "inprocess"]), default="serve", show_default=True,
              help="serve: start each configuration's own `vllm serve` command on a free localhost port and measure it "
                   "through the OpenAI-compatible API, as it will be deployed. inprocess: vLLM's AsyncLLM inside draftfit.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Interleaved rounds of the baseline and every configuration (A B A B …, the same prompts each round); "
                   "speedups are the median over rounds with a bootstrap 95% interval.")
@click.option("--servers-at-once", type=click.IntRange(min=1),
              help="Servers up side by side (the baseline and the configurations of one group). Default: as many as fit "
                   "in the memory available; 1 starts and stops each server in every round.")
@click.option("--server", metavar="URL",
              help="Measure a vLLM server that is already running (e.g. staging) instead of starting one; name the "
                   "configuration it serves with --config NAME:K and pass the baseline's server with --baseline-server.")
@click.option("--baseline-server", metavar="URL", help="With --server: a running server of the same model without speculation.")
@trust_remote_code
@show_prompts
@click.option("--no-resume", is_flag=True,
              help="Measure every configuration again. Default: a verify interrupted before it finished (same "
                   "prompts, levels, requests and engine settings) goes on where it stopped, keeping what it measured.")
@click.option("--dry-run", is_flag=True, help="Print what would run (configurations and vLLM speculative configs) and exit.")
@click.pass_context
def verify(ctx, results_file, top, recommended, configs, candidate_files, ks, concurrency, requests, timeout_s, gpu_memory_utilization,
           dtype, engine, rounds, servers_at_once, server, baseline_server, trust_remote_code, show_prompts, no_resume,
           dry_run) -> None:
    """Measure real vLLM runs against the predictions in RESULTS_FILE.

    Starts the exact `vllm serve` command of the baseline (no speculation) and of each chosen
    (candidate, k) — and of rank's recommended deploy command, its k schedule by batch size
    included, where it has one — on localhost, and sends them the prompts and sampling parameters `rank` used
    through the OpenAI-compatible streaming API (chat prompts as messages), at each concurrency
    level. The baseline and the configurations run in interleaved rounds (A B A B …) — all up at
    once where memory allows — so the machine's drift falls on both sides; every speedup and ITL
    is the median over rounds with a bootstrap 95% interval, and a run whose rounds disagree
    beyond it is flagged. vLLM's spec-decode counters come from each server's /metrics,
    differenced around each run; the machine's load is recorded per round. Records TTFT, ITL and end-to-end latency (p50/p95/p99), output tok/s,
    vLLM's own spec-decode counters (AL, acceptance rate, per position), errors and peak memory
    under `measured` in RESULTS_FILE (each entry beside its prediction and the error of it), flags
    every level where a configuration is slower than the baseline or has a worse p95/p99 ITL,
    and reports acceptance the prediction cannot explain as a suspected engine fault.

    The results file is saved after each configuration, so an interrupted verify loses at most
    the configuration it was measuring; run the same command again to finish it. A run that measured
    nothing (the server failed to start, answered errors, or is not vLLM) is kept apart under
    `measurement_failures`, never as measured.

    Exit code: 0 every run measured, 1 some run measured nothing, 2 usage or input error.

    \b
    Examples:
      draftfit verify reports/RUN/results.json --top 3 --concurrency 1,4,8
      draftfit verify reports/RUN/results.json --recommended
      draftfit verify reports/RUN/results.json --config ngram-2-4:3
      draftfit verify reports/RUN/results.json --candidate candidates/eagle.yaml --k 3
      draftfit verify reports/RUN/results.json --config ngram-2-4:3 --server http://staging:8000 \\
          --baseline-server http://staging:8001
    """
    from draftfit.cli.console import has_output, is_debug, long_run
    from draftfit.cli.tables import describe_plan, format_summary
    from draftfit.verify.comparison import verify_summary
    from draftfit.verify.run import VerifyRun

    debug = is_debug()
    run = VerifyRun(results_file, top=top, recommended=recommended, configs=configs, candidate_files=candidate_files, ks=ks,
                    concurrency=concurrency, requests=requests, timeout_s=timeout_s,
                    gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, argv=ctx.meta.get("draftfit.argv"), debug=debug,
                    trust_remote_code=trust_remote_code, show_prompts=show_prompts, resume=not no_resume,
                    engine=engine, rounds=rounds, servers_at_once=servers_at_once, server=server, baseline_server=baseline_server)
    if dry_run:
        _, _, _, _, planned, levels = run.plan()
        click.echo(describe_plan(planned, levels, requests))
        return
    log_path = Path(results_file).parent / "verify-engines.log"
    with long_run(log_path) as progress:
        run.progress = progress
        results, new = run.run()
    click.echo("")
    click.echo("Predicted vs measured (err = (predicted − measured) / measured; × = speedup vs. the measured baseline; "
               "ITL = time per output token)")
    verify_id = new[0]["verify_id"] if new else None
    click.echo(format_summary(results.measured, verify_id))
    summary = verify_summary([e for e in results.measured if e.get("verify_id") == verify_id])
    if summary["flagged"]:
        click.echo("")
        click.echo("Roll-out flags:")
        for item in summary["flagged"]:
            click.echo(f"  {item['config']} at concurrency {item['concurrency']}: {', '.join(item['flags'])}")
    from draftfit.explore import measured_better

    better = measured_better(results)
    if better:
        click.echo(f"\nRecommendation check: {better}")
    click.echo(f"\nwrote measured values into {results_file} and {results_file.with_suffix('.csv')}")
    if run.report_path is not None:
        click.echo(f"report: {run.report_path}")
    if has_output(log_path):
        click.echo(f"engine and library output: {log_path}")
    if run.failures:
        from draftfit.verify.run import failure_lines

        for line in failure_lines(run.failures):
            click.echo(line, err=True)
        click.echo(f"verify failed: {len(run.failures)} run(s) measured nothing (kept apart in {results_file} under "
                   "measurement_failures). Fix the cause above and run the same command again", err=True)
        sys.exit(VERIFY_FAILED)
