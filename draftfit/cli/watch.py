"""`draftfit watch URL --results RESULTS.json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command("watch")
@click.argument("url")
@click.option("--results", "results_file", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The results.json `rank` wrote for this deployment.")
@click.option("--config", metavar="NAME:K", help="The configuration the server runs. Default: rank's recommended deploy command, its k schedule by "
                   "batch size included (the prediction of the k it runs at the observed concurrency).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds between scrapes of the server's /metrics.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to watch (0: one scrape, e.g. from cron after a first run).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every observation and the verdict here (rewritten after each scrape).")
def watch(url, results_file, config, interval_s, duration_s, json_path) -> None:
    """Hold a live vLLM server at URL against the prediction for the configuration it runs.

    Scrapes URL/metrics every --interval seconds for --duration seconds and shows, since the
    watch began: vLLM's AL and per-position acceptance (its spec-decode counters), the mean,
    p50 and p95 time per output token (its TPOT histogram: per finished request, decode time
    over tokens — the ITL draftfit predicts; vLLM's inter-token histogram is per engine step and
    shown as the step gap), and the concurrency the server saw (its running-requests gauge) —
    beside what `rank` predicted for the configuration at that concurrency. Exits 3 on drift
    beyond the prediction's bounds, once there is enough traffic to judge (50 drafting steps,
    5 finished requests): AL below the predicted range (acceptance sliding
    toward 1) or a mean ITL above the slowest predicted one (slower than predicted). Exits 0
    otherwise, and 2 when the server cannot be read.

    \b
    Examples:
      draftfit watch http://localhost:8000 --results reports/RUN/results.json
      draftfit watch http://staging:8000 --results results.json --config ngram-2-4:3 --duration 600 --json watch.json
    """
    from draftfit import results as results_mod
    from draftfit.io import atomic_write_text
    from draftfit.watch import DRIFT_EXIT, format_observation, run_watch

    results = results_mod.load(results_file)
    if json_path is not None:
        from draftfit.outputs import check_output_file, head_contains

        check_output_file(Path(json_path), inputs=[results_file], what="watch record", option="--json",
                          is_ours=lambda path: head_contains(path, b'"observations"'))

    def save(summary) -> None:
        if json_path is not None:
            atomic_write_text(Path(json_path), json.dumps(summary, indent=1, default=str))

    summary = run_watch(url, results, config=config, interval_s=interval_s, duration_s=duration_s,
                        show=lambda observation: click.echo(format_observation(observation)), save=save)
    if summary["drift"]:
        click.echo(f"drift: {summary['config']} on {url} is outside its prediction", err=True)
        sys.exit(DRIFT_EXIT)
    click.echo(f"{summary['config']} on {url}: within its prediction")
