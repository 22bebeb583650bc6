"""The terminal table of `draftfit rank`, before and after `draftfit verify` has measured configs."""

from draftfit.cli.tables import format_table
from draftfit.results import Results


def _config(name, k, rank, speedups, measured=None):
    levels = []
    for concurrency, speedup in speedups.items():
        level = {"concurrency": concurrency, "speedup_predicted": speedup}
        level.update((measured or {}).get(concurrency, {}))
        levels.append(level)
    return {"candidate": name, "k": k, "rank": rank, "pareto": rank == 1, "al_predicted": 2.5, "al_ci_low": 2.4,
            "al_ci_high": 2.6, "extra_vram_gib": 0.0, "fits": True, "per_concurrency": levels}


def _results(configs):
    return Results(run_id="r", created="t", provenance={}, study={}, candidates=[], configs=configs)


def test_table_without_measurements_has_one_row_per_config():
    text = format_table(_results([_config("ngram", 2, 1, {1: 1.5, 4: 1.2}), _config("ngram", 4, 2, {1: 1.4, 4: 1.1})]))
    lines = text.splitlines()
    assert len(lines) == 4 and "measured" not in text
    assert lines[2].split()[:3] == ["1*", "ngram", "k=2"] and lines[3].split()[:3] == ["2", "ngram", "k=4"]
    assert "1.50" in lines[2] and "1.20" in lines[2]


def test_measured_rows_show_the_error_of_each_prediction():
    measured = {4: {"al_measured": 2.0, "speedup_measured": 0.8}}
    text = format_table(_results([_config("ngram", 2, 1, {1: 1.5, 4: 1.2}, measured)]))
    line = [x for x in text.splitlines() if "measured" in x]
    assert line == ["       measured @4: AL 2.00 (pred. err +25%), × 0.80 (pred. err +50%)"]


def test_configs_that_do_not_fit_are_listed_unranked():
    unfit = _config("self-draft", 4, None, {1: 0.9}) | {"fits": False}
    lines = format_table(_results([_config("ngram", 2, 1, {1: 1.5}), unfit])).splitlines()
    assert lines[-2].startswith("  not ranked — they do not fit in memory")
    assert lines[-1].split()[:4] == ["-", "self-draft", "k=4", "2.50"] and lines[-1].split()[-3:] == ["0.90", "0.000", "NO"]


def test_long_rankings_are_cut_with_a_pointer():
    text = format_table(_results([_config("ngram", k, k, {1: 2.0 - k / 10}) for k in range(1, 6)]), limit=3)
    assert text.splitlines()[-1] == "  (2 more ranked configs in results.csv and the report)"


def test_a_long_ranking_still_shows_the_best_configuration_of_every_draft():
    configs = [_config("ngram", k, k, {1: 3.0 - k / 10}) for k in range(1, 6)]
    configs += [_config("early-exit-4", 2, 6, {1: 2.2}), _config("early-exit-4", 3, 7, {1: 2.1}), _config("self", 1, 8, {1: 1.2})]
    lines = format_table(_results(configs), limit=3).splitlines()
    i = lines.index("  the best configuration of every other draft:")
    assert [line.split()[:3] for line in lines[i + 1:i + 3]] == [["6", "early-exit-4", "k=2"], ["8", "self", "k=1"]]
    assert lines[-1] == "  (3 more ranked configs in results.csv and the report)"


def test_the_recommendation_says_why_it_is_not_rank_one():
    """By the tie rule the recommendation can sit below faster configs; the terminal gives the reason."""
    from draftfit.cli.tables import format_recommendation

    reason = "rank 9 at concurrency 1: tied within CI with suffix k=8 (1.93× [1.62, 2.40]); chosen for smaller k (k=2 < 8)"
    rec = {"primary_concurrency": 1, "candidate": "suffix", "k": 2, "speedup": 1.6465, "speedup_low": 1.5011,
           "speedup_high": 1.8260, "reason": reason,
           "schedule": [{"concurrency": 1, "k": 2}, {"concurrency": 4, "k": 2}, {"concurrency": 16, "k": 4}]}
    assert format_recommendation(rec).splitlines() == [
        "Recommendation (predicted): suffix with k=2 — 1.65× [1.50, 1.83] at concurrency 1",
        f"why: {reason}",
        "k by concurrency: 1: k=2, 4: k=2, 16: k=4",
    ]
    none = format_recommendation({"reason": "no config is predicted to pay at concurrency 1"})
    assert none == "Recommendation (predicted): no speculation — no config is predicted to pay at concurrency 1"


def test_a_config_that_never_drafted_shows_no_al():
    """Prompt lookup that found no match in a small sample has no drafting step: AL is undefined
    (NaN in memory, null in results.json), shown as such rather than as "nan"."""
    for undefined in (float("nan"), None):
        config = _config("ngram", 2, 1, {1: 1.0}) | {"al_predicted": undefined, "al_ci_low": undefined, "al_ci_high": undefined}
        line = format_table(_results([config])).splitlines()[2]
        assert "— (no drafts)" in line and "nan" not in line
