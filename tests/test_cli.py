"""The command group: help, version, one-line errors, --debug, light imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit import __version__
from draftfit.cli import COMMANDS, cli
from draftfit.errors import ModelRefError


def test_help_lists_the_built_commands():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("check", "pad-vocab"):
        assert name in result.output


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


@pytest.mark.parametrize("name", [name for name in COMMANDS if cli.get_command(None, name) is not None])
def test_every_command_has_help(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_errors_are_one_line_without_traceback(tmp_path):
    result = CliRunner().invoke(cli, ["check", str(tmp_path / "missing"), "smollm2"])
    assert result.exit_code == 2
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_debug_shows_the_exception(tmp_path):
    result = CliRunner().invoke(cli, ["--debug", "check", str(tmp_path / "missing"), "smollm2"])
    assert isinstance(result.exception, ModelRefError)


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2 and "No such command" in result.output


def test_module_entry_point_and_light_imports():
    code = (
        "import sys, runpy; sys.argv=['draftfit','--help']\n"
        "try:\n    runpy.run_module('draftfit', run_name='__main__')\nexcept SystemExit as e:\n    assert e.code in (0, None)\n"
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'datasets', 'sklearn', 'matplotlib') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Usage: draftfit" in out and "HEAVY []" in out


def test_ctrl_c_says_how_to_resume_and_exits_130(monkeypatch, tmp_path):
    from draftfit import pipeline

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.RankRun, "run", interrupted)
    candidate = Path(__file__).resolve().parents[1] / "candidates" / "ngram-5.yaml"
    result = CliRunner().invoke(cli, ["rank", str(candidate), "--reports-dir", str(tmp_path)])
    assert result.exit_code == 130
    assert result.output.strip().splitlines()[-1] == "interrupted — run the same command again to resume"
    assert "Aborted!" not in result.output
