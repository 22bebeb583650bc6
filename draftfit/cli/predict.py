"""`draftfit predict TARGET --gpu NAME ...`: a what-if that runs no model."""

from __future__ import annotations

import click

from draftfit.cli.options import comma_parts, int_list, trust_remote_code


def _rates(ctx, param, value: str | None):
    if value is None:
        return None
    try:
        rates = tuple(float(part) for part in comma_parts(value))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give fractions separated by commas, e.g. 0.8,0.6,0.45") from None
    if not all(0.0 <= r <= 1.0 for r in rates):  # also refuses nan
        raise click.BadParameter(f"{value!r}: acceptance rates are fractions between 0 and 1, e.g. 0.8,0.6,0.45")
    return rates


@click.command("predict")
@click.argument("target")
@click.option("--draft", help="Draft model reference (a draft model, an EAGLE/EAGLE-3 head or MTP layers): its config.json is enough.")
@click.option("--method", type=click.Choice(["draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"]),
              help="The speculative method. Default draft_model with --draft.")
@click.option("--k", "ks", callback=int_list, metavar="K[,K...]",
              help="Speculative tokens to predict for. With --acceptance-length the first is the k it was measured at.")
@click.option("--acceptance-length", type=click.FloatRange(min=1), help="vLLM's measured mean acceptance length (1 + accepted/drafts).")
@click.option("--acceptance-rates", callback=_rates, metavar="R1,R2,...",
              help="vLLM's measured per-position acceptance rates (accepted_per_pos[i] / drafts), one per position.")
@click.option("--gpu", required=True, help="GPU from the catalog, e.g. 'H100 SXM'.")
@click.option("--gpu-count", type=click.IntRange(min=1), help="GPUs per replica. Default: the tensor-parallel size.")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Target (and draft) tensor-parallel size.")
@click.option("--concurrency", callback=int_list, default="1,4,8,16,32", show_default=True, help="Concurrency levels.")
@click.option("--input-len", type=click.IntRange(min=1), default=512, show_default=True, help="Mean prompt tokens.")
@click.option("--output-len", type=click.IntRange(min=1), default=256, show_default=True, help="Mean output tokens.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(min=0, min_open=True, max=1), default=0.9, show_default=True,
              help="vLLM's memory fraction.")
@click.option("--max-model-len", type=click.IntRange(min=16), help="Context length. Default: the target's max_position_embeddings.")
@click.option("--kv-cache-dtype", help="vLLM's kv_cache_dtype (auto, fp8, bf16, ...). Default auto: the activation dtype.")
@click.option("--gpu-catalog", type=click.Path(dir_okay=False), help="YAML file adding GPUs to the catalog.")
@click.option("--json", "as_json", is_flag=True, help="Print the prediction as JSON (docs/predict-json.md).")
@trust_remote_code
def predict(target, draft, method, ks, acceptance_length, acceptance_rates, gpu, gpu_count, tensor_parallel_size, concurrency,
            input_len, output_len, gpu_memory_utilization, max_model_len, kv_cache_dtype, gpu_catalog, as_json,
            trust_remote_code) -> None:
    """Predict speedup, ITL and KV capacity on another GPU, TP, k or concurrency, without running a model.

    For acceptance you have measured (`vllm bench serve`, a server's /metrics): give vLLM's
    per-position rates (--acceptance-rates), or its mean acceptance length (--acceptance-length,
    which implies per-position rates under the i.i.d. assumption; the output says so). TARGET and
    DRAFT are model references; a directory holding only config.json suffices. Without --draft or
    --method it predicts the baseline and the KV capacity. Every number is predicted (the step model of
    the catalog GPU, the cost model `rank` uses; its constants' sources are in the JSON provenance,
    and python benchmarks/published_gpu.py shows its error on published measurements).

    \b
    Examples:
      draftfit predict meta-llama/Llama-3.1-70B-Instruct --draft meta-llama/Llama-3.2-1B-Instruct \\
          --k 3,4,5 --acceptance-rates 0.8,0.62,0.48,0.37,0.29 --gpu "H100 SXM" --tensor-parallel-size 4
      draftfit predict ./llama-70b-config-dir --gpu "A100 80GB SXM" --tensor-parallel-size 8 --json
    """
    from draftfit.what_if import predict_what_if

    result = predict_what_if(
        target, gpu=gpu, draft=draft, method=method, ks=ks, acceptance_length=acceptance_length,
        acceptance_rates=acceptance_rates, gpu_count=gpu_count or tensor_parallel_size, tensor_parallel_size=tensor_parallel_size,
        concurrency=concurrency, input_len=input_len, output_len=output_len,
        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
        gpu_catalog=gpu_catalog, trust_remote_code=trust_remote_code,
    )
    if as_json:
        click.echo(result.to_json())
        return
    from draftfit.cli.tables import format_what_if

    click.echo(format_what_if(result))
