"""Shared CLI options: study options are made from the settings model, so their help, default and
range cannot drift from it; one list parser and one --trust-remote-code for every command."""

from __future__ import annotations

import click
import pytest

from draftfit.candidates import StudySettings
from draftfit.cli import cli
from draftfit.cli.options import int_list, study_option

COMMANDS = {name: cli.get_command(None, name) for name in cli.list_commands(None)}
RANK = COMMANDS["rank"]
STUDY_PARAMS = [p for p in RANK.params if p.name in StudySettings.model_fields]


def test_rank_offers_the_study_settings_with_their_descriptions_and_defaults():
    assert len(STUDY_PARAMS) >= 17
    for param in STUDY_PARAMS:
        field = StudySettings.model_fields[param.name]
        assert param.help.startswith(field.description), param.name
        assert param.default is None  # not given: the study file and candidate files still apply
        if field.default is not None and not isinstance(field.default, bool):
            shown = ",".join(map(str, field.default)) if isinstance(field.default, tuple) else f"{field.default:g}" \
                if isinstance(field.default, float) else str(field.default)
            assert f"Default {shown}." in param.help, param.name


@pytest.mark.parametrize("name, good, bad", [
    ("sample_size", "5", "0"),
    ("top_p", "1", "0"),
    ("engine_memory_utilization", "0.3", "1.5"),
    ("latency_source", "roofline", "guess"),
])
def test_a_study_option_takes_its_fields_range(name, good, bad):
    command = study_option(name)(click.command()(lambda **kw: None))
    param = command.params[0]
    assert param.type.convert(good, param, None) is not None
    with pytest.raises(click.BadParameter):
        param.type.convert(bad, param, None)


def test_a_setting_without_a_description_cannot_become_an_option():
    with pytest.raises(TypeError, match="needs a description"):
        study_option("length_thresholds")


@pytest.mark.parametrize("text, parsed", [("1,4, 8", (1, 4, 8)), (None, None)])
def test_int_list(text, parsed):
    assert int_list(None, None, text) == parsed


@pytest.mark.parametrize("text", ["1,x", "0,2", ","])
def test_int_list_refuses(text):
    with pytest.raises(click.BadParameter, match="whole numbers"):
        int_list(None, None, text)


def test_rank_help_lists_the_candidate_file_keys():
    from draftfit.candidates import Candidate, DraftSpec

    text = " ".join(RANK.epilog.split())
    assert all(name in text for name in [*Candidate.model_fields, *DraftSpec.model_fields])


def test_verify_takes_the_dtype():
    param = next(p for p in COMMANDS["verify"].params if p.name == "dtype")
    assert set(param.type.choices) == {"auto", "bfloat16", "float16", "float32"} and "Default: the study's" in param.help


def test_every_command_has_one_trust_remote_code_help():
    helps = {p.help for command in COMMANDS.values() for p in command.params if p.name == "trust_remote_code"}
    assert len(helps) == 1 and {"rank", "verify", "check", "pad-vocab"} <= {
        name for name, command in COMMANDS.items() if any(p.name == "trust_remote_code" for p in command.params)}
