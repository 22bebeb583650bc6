"""`draftfit rank candidates/*.yaml`."""

from __future__ import annotations

from pathlib import Path

import click

from draftfit.candidates import candidate_fields_help
from draftfit.cli.options import show_prompts, study_options, trust_remote_code


@click.command("rank", epilog=candidate_fields_help())
@click.argument("candidate_files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--study", "study_file", type=click.Path(dir_okay=False, path_type=Path),
              help="YAML file of study settings (below). Precedence: defaults < study file < candidate files' `study:` blocks < options.")
@study_options("prompts", "prompt_column", "messages_column", "category_column", "sample_size", "seed", "temperature", "top_p", "max_tokens", "max_model_len",
               "draft_sample_method", "dtype", "latency_source")
@click.option("--profile-plan", type=click.Choice(["standard", "quick"]), default="standard", show_default=True,
              help="How many engine steps to time for the measured latency profile and the served steps "
                   "(quick: fewer, noisier; the served runs 64 tokens long, not 128).")
@study_options("gpu", "gpu_count", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
               "distributed_executor_backend", "gpu_memory_utilization", "engine_memory_utilization",
               "concurrency", "primary_concurrency", "vllm_version")
@click.option("--gpu-catalog", type=click.Path(dir_okay=False, path_type=Path), help="YAML file adding GPUs to the catalog.")
@study_options("scrub")
@click.option("--reports-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"), show_default=True,
              help="Where reports/<run-id>/ is written.")
@click.option("--run-id", help="Name of the run directory (default: a UTC timestamp).")
@trust_remote_code
@show_prompts
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
    from draftfit.cli.tables import format_recommendation, format_table
    from draftfit.outputs import check_run_dir, check_run_id, removed_on_failure
    from draftfit.pipeline import PROFILE_PLANS, RankRun
    from draftfit.results import new_run_id

    run_id = check_run_id(run_id) if run_id is not None else new_run_id()
    run_dir = check_run_dir(reports_dir / run_id)
    candidates, from_files = load_candidates(list(candidate_files))
    overrides = dict(options)
    study = build_study(study_file=study_file, from_candidates=from_files, overrides=overrides)
    # every input error surfaces here, before a model loads or anything is written
    check_inputs(candidates, study, gpu_catalog=gpu_catalog, trust_remote_code=trust_remote_code)
    from draftfit.cli.console import has_output, long_run

    run = RankRun(candidates, study, reports_root=reports_dir, run_id=run_id,
                  argv=click.get_current_context().meta.get("draftfit.argv"),
                  gpu_catalog=str(gpu_catalog) if gpu_catalog else None,
                  profile_plan=dict(PROFILE_PLANS[profile_plan]), show_prompts=show_prompts,
                  trust_remote_code=trust_remote_code)
    run.preflight()  # the run's own input checks, before its folder is made
    log_path = run_dir / "engines.log"
    with removed_on_failure(run_dir), long_run(log_path) as progress:
        run.progress = progress
        results, out_dir = run.run()
    for skipped in results.skipped:
        click.echo(f"skipped {skipped['candidate']}: {skipped['reason']}")
    for failed in results.failed:
        click.echo(f"failed {failed['candidate']}: {failed.get('reason') or failed.get('error')}", err=True)
    click.echo("")
    click.echo(f"Ranking at concurrency {study.primary_concurrency} (× = predicted speedup vs. no speculation at each "
               f"concurrency; latency source: {study.latency_source}; * = Pareto front of speedup vs. extra VRAM)")
    click.echo(format_table(results))
    click.echo("")
    click.echo(format_recommendation(results.recommendation or {}))
    deploy = (results.deploy or {}).get("recommended")
    if deploy:
        for command in deploy.get("prepare") or []:
            click.echo(f"Prepare: {command}")
        click.echo(f"Deploy: {deploy.get('shell')}")
        for note in deploy.get("notes") or []:
            click.echo(f"  note: {note}")
    click.echo(f"\nwrote {out_dir / 'report.html'} (review it before choosing), {out_dir / 'results.json'} and {out_dir / 'results.csv'}")
    if has_output(log_path):
        click.echo(f"engine and library output: {log_path}")
