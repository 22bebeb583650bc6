"""The HTML report: self-contained, sections in the reviewer's order, every figure labelled,
hostile text escaped, measured values shown once `verify` has run, `draftfit report` CLI."""

from __future__ import annotations

import base64
import copy
import json
import re
import xml.etree.ElementTree as ET
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit import explore
from draftfit.cli import cli
from draftfit.report import SECTIONS, plots, render_html, write_report
from draftfit.results import Results, load

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "reports" / "example" / "results.json"
HOSTILE = '<script>alert("x")</script>'
SPECIAL = "<|im_start|>"
MEASURED_FAULT = "measured AL 1.02 is far outside the predicted range <temperature 0.8>"


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def example() -> Results:
    return load(EXAMPLE)


def dist(p50: float) -> dict:
    return {"n": 100, "mean": p50 * 1.05, "p50": p50, "p95": p50 * 1.3, "p99": p50 * 1.6}


def with_measured(results: Results) -> Results:
    """The example plus a synthetic `measured` list in the shape `draftfit verify` writes: a
    baseline (candidate None) and the two best configs at every concurrency level."""
    data = results.model_dump(mode="json")
    levels = explore.concurrency_levels(results)
    top = sorted((c for c in results.configs if c.get("rank") is not None), key=lambda c: c["rank"])[:2]
    measured = []
    for level in levels:
        measured.append({
            "kind": "measured", "candidate": None, "k": None, "concurrency": level, "engine_failed": False,
            "requests": 12, "completed": 12, "errors": 0, "output_tok_s_measured": 20.0 * level,
            "ttft_ms_measured": dist(40.0), "itl_ms_measured": dist(30.0 + level),
            "memory_measured": {"kind": "measured", "peak_engine_rss_gib": 2.25, "peak_device_used_gib": None},
            "engine_fault": None, "flags": [],
        })
        for i, c in enumerate(top):
            pred = explore.level_of(c, level)
            first = i == 0 and level == levels[0]
            measured.append({
                "kind": "measured", "candidate": c["candidate"], "k": c["k"], "concurrency": level, "engine_failed": False,
                "requests": 12, "completed": 11 if first else 12, "errors": 1 if first else 0,
                "al_measured": 0.9 * c["al_predicted"] + 0.1, "acceptance_rate_measured": 0.5,
                "per_position_measured": [0.9 * x for x in c["per_position_predicted"]],
                "speedup_measured": 0.8 * pred["speedup_predicted"], "output_tok_s_measured": 47.0,
                "ttft_ms_measured": dist(41.0), "itl_ms_measured": dist(21.5),
                "memory_measured": {"kind": "measured", "peak_engine_rss_gib": 3.5, "peak_device_used_gib": None},
                "engine_fault": MEASURED_FAULT if first else None,
                "flags": ["errors", "engine-fault-suspected"] if first else [],
            })
    data["measured"] = measured
    data["provenance"]["verify"] = [{"verify_id": "v1", "kind": "measured", "started": "2026-11-29T12:00:00Z", "device": "cpu",
                                    "configs": ["baseline"] + [explore.config_label(c) for c in top], "concurrency": levels,
                                    "requests_per_run": 12, "command_line": "draftfit verify results.json --top 2"}]
    return Results.model_validate(data)


def hostile(results: Results) -> Results:
    """The example with markup and special tokens in every place text from prompts, datasets or
    model files reaches the report."""
    data = copy.deepcopy(results.model_dump(mode="json"))
    data["warnings"].append(f"prompt source {HOSTILE} had {SPECIAL} in it")
    data["prompts"].setdefault("dropped", []).append(
        {"id": 7, "category": HOSTILE, "reason": f"over context: {SPECIAL}", "n_input_tokens": 5000})
    data["prompts"].setdefault("summary", {})["source"] = f"logs/{HOSTILE}.jsonl"
    for config in data["configs"]:
        config.setdefault("segments_predicted", {}).setdefault("category", {})[HOSTILE] = {"prompts": 1, "al": 1.5}
    data["skipped"].append({"candidate": "evil", "reason": f"incompatible: token {SPECIAL} means {HOSTILE}"})
    check = {
        "candidate": "evil", "schema_version": 1, "verdict": "incompatible", "summary": f"token 1 is {SPECIAL} vs {HOSTILE}",
        "target": {"label": "t"}, "draft": {"label": HOSTILE},
        "blocking": [{"code": "token_ids_differ", "message": f"id 1: {SPECIAL} vs {HOSTILE}"}], "warnings": [], "harmless": [],
        "tokenizer": [{"component": "model", "equal": False, "target": "BPE", "draft": "BPE", "differences": [f"x: {HOSTILE}"]}],
        "vocab": {"identical": False, "first_different": [{"id": 1, "target": SPECIAL, "draft": HOSTILE}]},
        "special_tokens": {"roles": [{"role": "bos", "target": {"id": 1, "token": SPECIAL}, "draft": {"id": 1, "token": HOSTILE}, "equal": False}],
                           "added_target": [{"id": 1, "token": SPECIAL, "special": True}]},
        "chat_template": {"equal": False, "target_present": True, "draft_present": True, "diff": [f"+{HOSTILE}", f"-{SPECIAL}"]},
        "probe": {"texts": 1, "identical": 0, "share_identical": 0.0, "target_tokens": 3, "draft_tokens": 4, "by_category": [],
                  "first_difference": {"category": "file", "text": f"user prompt {HOSTILE}", "position": 0,
                                       "target_pieces": [SPECIAL], "draft_pieces": [HOSTILE]}},
        "engines": {"vllm": {"engine": "vllm", "verdict": "incompatible", "reason": HOSTILE, "error": SPECIAL, "fix": HOSTILE}},
    }
    data["checks"].append(check)
    data["candidates"].append({"name": "evil", "target": "smollm2", "k": [1],
                               "draft": {"method": "draft_model", "model": HOSTILE, "derived": None}})
    return Results.model_validate(data)


@pytest.fixture(scope="module")
def example_html(example) -> str:
    return render_html(example, results_path="reports/example/results.json")


@pytest.fixture(scope="module")
def measured_html(example) -> str:
    return render_html(with_measured(example))


@pytest.fixture(scope="module")
def hostile_html(example) -> str:
    return render_html(hostile(example))


class Page(HTMLParser):
    """Tags, attributes, ids and the text of h2 headings of an HTML page."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.ids: list[str] = []
        self.h2: list[str] = []
        self._in_h2 = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if attrs.get("id"):
            self.ids.append(attrs["id"])
        if tag == "h2":
            self._in_h2 = True
            self.h2.append("")

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_h2:
            self.h2[-1] += data


def svgs(html: str) -> list[str]:
    return [base64.b64decode(m).decode("utf-8") for m in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)]


URL_ATTRS = {"src", "href", "srcset", "action", "formaction", "poster", "data", "background", "cite", "ping", "manifest"}


def external_references(html: str) -> list[str]:
    """Anything the page would fetch: URL attributes that are not in-page anchors or data URIs,
    CSS url()/@import, and <script>/<link>/<iframe>/<object>/<embed>/<base> elements."""
    found = []
    page = Page(html)
    for tag, attrs in page.tags:
        if tag in {"script", "link", "iframe", "object", "embed", "base", "frame", "audio", "video", "source"}:
            found.append(f"<{tag}>")
        for name, value in attrs.items():
            if name in URL_ATTRS and value is not None and not (value.startswith("#") or value.startswith("data:")):
                found.append(f"{tag}[{name}]={value}")
            if name == "style" and value and re.search(r"url\(|@import", value, re.I):
                found.append(f"{tag}[style]={value}")
    for css in re.findall(r"<style[^>]*>(.*?)</style>", html, re.S):
        if re.search(r"url\(|@import", css, re.I):
            found.append("css url()/@import")
    return found


# ---------------------------------------------------------------------------------------------
# self-contained, ordered, labelled


def test_the_page_fetches_nothing(example_html, measured_html):
    for html in (example_html, measured_html):
        assert external_references(html) == []
        assert not re.search(r"https?://", html)  # no URL of any kind, not even in text
        assert "<script" not in html.lower()


def test_the_inline_figures_fetch_nothing(measured_html):
    images = svgs(measured_html)
    assert len(images) >= 6
    for image in images:
        root = ET.fromstring(image)
        for element in root.iter():
            for name, value in element.attrib.items():
                if name.endswith("href"):
                    assert value.startswith("#"), (name, value)
        assert set(re.findall(r"https?://[^\"'\s]+", image)) <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
        assert "<script" not in image and "<foreignObject" not in image


def test_sections_come_in_the_reviewers_order(example_html):
    page = Page(example_html)
    order = [sid for sid, _ in SECTIONS]
    assert [i for i in page.ids if i in order] == order
    headings = [h.split()[0] for h in page.h2]
    assert headings == [name.split()[0] for _, name in SECTIONS]


@pytest.mark.parametrize(
    "figure, kind, words",
    [
        ("al_vs_k_figure", "predicted", ["k (speculative tokens per step)", "mean acceptance length (tokens/step)", "k+1 (every draft accepted)"]),
        ("per_position_figure", "predicted", ["draft position (1 = first drafted token)", "P(first i drafts accepted)"]),
        ("speedup_figure", "predicted", ["concurrency (requests in flight)", "speedup vs no speculation (×)", "break-even (no speculation = 1×)"]),
        ("vram_stack_figure", "predicted", ["GiB per GPU", "target weights", "draft KV pool"]),
        ("extra_vram_figure", "predicted", ["GiB per GPU", "draft weights"]),
        ("pareto_figure", "predicted", ["extra VRAM per GPU (GiB)", "Pareto front"]),
    ],
)
def test_every_figure_says_what_it_shows_and_has_units(example, figure, kind, words):
    fig = getattr(plots, figure)(example)
    assert fig is not None
    image = plots.svg(fig)
    # matplotlib writes each text as a comment beside its glyph paths
    texts = set(re.findall(r"<!-- (.*?) -->", image))
    assert kind in texts
    for word in words:
        assert any(word.replace("<", "&lt;").replace(">", "&gt;") in t for t in texts), word


@pytest.mark.parametrize("what, words", [("speedup", ["predicted (×)", "measured (×)"]), ("al", ["predicted (tokens/step)", "measured (tokens/step)"]),
                                         ("positions", ["draft position (1 = first drafted token)", "P(first i drafts accepted)"])])
def test_measured_figures_are_labelled_measured(example, what, words):
    results = with_measured(example)
    image = plots.svg(plots.measured_figure(results, what) if what != "positions" else plots.measured_positions_figure(results))
    texts = set(re.findall(r"<!-- (.*?) -->", image))
    assert "measured" in texts and all(w in texts for w in words)


def test_every_figure_in_the_page_has_a_kind_badge(measured_html):
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", measured_html, re.S)
    assert len(captions) == len(svgs(measured_html))
    assert all(re.search(r'class="kind (predicted|measured|bound)"', c) for c in captions)


def _drawn_texts(fig, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    drawn = []
    original = Text.draw

    def draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append((self.get_text(), self.get_window_extent(renderer)))

    FigureCanvasAgg(fig)
    fig.canvas.draw()  # lay out first
    monkeypatch.setattr(Text, "draw", draw)
    fig.canvas.draw()
    monkeypatch.setattr(Text, "draw", original)
    return drawn


@pytest.mark.parametrize("figure", ["al_vs_k_figure", "per_position_figure", "speedup_figure", "vram_stack_figure",
                                    "extra_vram_figure", "pareto_figure", "measured_figure", "measured_positions_figure"])
def test_figure_labels_neither_overlap_nor_leave_the_figure(example, figure, monkeypatch):
    fig = getattr(plots, figure)(with_measured(example))
    texts = _drawn_texts(fig, monkeypatch)
    assert len(texts) >= 5
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in texts:
        assert box.x0 >= -0.5 and box.y0 >= -0.5 and box.x1 <= width + 0.5 and box.y1 <= height + 0.5, f"{text!r} is clipped"
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1:]:
            shrunk_a = box_a.padded(-0.5)
            assert not shrunk_a.overlaps(box_b.padded(-0.5)), f"{a!r} overlaps {b!r}"


# ---------------------------------------------------------------------------------------------
# contents


def test_recommendation_names_draft_k_schedule_gain_vram_and_command(example, example_html):
    rec = example.recommendation
    assert rec and rec.get("candidate")
    section = example_html.split('id="recommendation"')[1].split("</section>")[0]
    assert f"<strong>{rec['candidate']}</strong>" in section and f"<strong>k = {rec['k']}</strong>" in section
    assert f"{rec['speedup']:.2f}×" in section
    for entry in rec["schedule"]:
        assert f'<td class="n">{entry["concurrency"]}</td>' in section
    assert "ITL gain" in section and "extra VRAM per GPU" in section
    shell = example.deploy["recommended"]["shell"]
    text = unescape(re.sub(r"<[^>]+>", "", section))
    assert shell in text  # the deploy command, whole, as the page shows it


def test_no_recommendation_says_serve_without_speculation(example):
    data = example.model_dump(mode="json")
    data["recommendation"] = {"primary_concurrency": 1, "candidate": None, "k": None, "schedule": [],
                              "reason": "best fitting config x k=1 (0.90×) is predicted slower than no speculation"}
    html = render_html(Results.model_validate(data), figures=False)
    assert "Serve without speculation." in html and "predicted slower than no speculation" in html


def test_an_off_level_of_the_schedule_shows_what_it_runs_there_not_the_baseline(example):
    """Off (k = 0), vLLM still runs a draft model's first pass each step: the row shows that
    predicted speedup and ITL, not 1.00× and the baseline's ITL; a record without them shows none."""
    data = example.model_dump(mode="json")
    rec = data["recommendation"]
    last = rec["schedule"][-1]
    last.update(k=None, speedup=0.95, off_speedup=0.93, reason="off: best predicted speedup 0.95× (k=1) < 1")
    for config in (c for c in data["configs"] if c["candidate"] == rec["candidate"]):
        level = next(v for v in config["per_concurrency"] if v["concurrency"] == last["concurrency"])
        level.update(itl_off_ms_predicted=level["itl_base_ms_predicted"] / 0.93, speedup_off_predicted=0.93)
    base = level["itl_base_ms_predicted"]

    def off_row(results: dict) -> str:
        section = render_html(Results.model_validate(results), figures=False).split('id="recommendation"')[1]
        row = section.split(f'<td class="n">{last["concurrency"]}</td>')[1].split("</tr>")[0]
        return unescape(re.sub(r"<[^>]+>", "", row))

    row = off_row(data)
    assert "0.93×" in row and "best k: 0.95×" in row and "1.00×" not in row
    assert f"{base / 0.93:.1f}" in row or f"{base / 0.93:.0f}" in row
    del last["off_speedup"]
    for config in data["configs"]:
        for level in config["per_concurrency"]:
            level.pop("itl_off_ms_predicted", None)
    older = off_row(data)
    assert "1.00×" not in older and "—" in older


def test_ranking_lists_every_config_with_speedup_at_each_level(example, example_html):
    section = example_html.split('id="ranking"')[1].split("</section>")[0]
    rows = re.findall(r"<tr class=\"[^\"]*\">", section)
    assert len(rows) == len(example.configs)
    for level in explore.concurrency_levels(example):
        assert f"× @{level}" in section


def without_measured(results: Results) -> Results:
    """The results as `rank` wrote them, before `draftfit verify` added measurements."""
    data = results.model_dump(mode="json")
    data["measured"] = []
    data["provenance"].pop("verify", None)
    for config in data["configs"]:
        for level in config["per_concurrency"]:
            for key in [k for k in level if k.endswith("_measured")]:
                del level[key]
    return Results.model_validate(data)


def test_not_measured_yet(example):
    html = render_html(without_measured(example), results_path="reports/example/results.json")
    section = html.split('id="measured"')[1].split("</section>")[0]
    assert "Not measured yet — run <code>draftfit verify reports/example/results.json</code>" in section


def test_the_example_shows_what_verify_measured(example, example_html):
    assert example.measured, "reports/example was verified (draftfit verify --top 3)"
    section = example_html.split('id="measured"')[1].split("</section>")[0]
    assert "Not measured yet" not in section and "no speculation (baseline)" in section
    for entry in example.measured:
        if entry["candidate"] is not None:
            assert f"{entry['candidate']} k={entry['k']}" in section


def test_measured_section_when_verify_has_run(example, measured_html):
    section = measured_html.split('id="measured"')[1].split("</section>")[0]
    assert "Not measured yet" not in section
    assert "no speculation (baseline)" in section and "1.00× (reference)" in section
    assert "21.5" in section and "27.9" in section and "34.4" in section  # ITL p50, p95, p99 (ms)
    assert "47.0" in section and "3.50 GiB" in section and "12 (1)" in section
    assert section.count("<figure>") == 3
    rows = explore.measured_vs_predicted(with_measured(example))
    assert rows[0]["baseline"] and rows[0]["itl_mean_ms_predicted"] is not None
    top = rows[-1]
    assert top["speedup_measured"] == pytest.approx(0.8 * top["speedup_predicted"])
    warnings = measured_html.split('id="warnings"')[1].split("</section>")[0]
    assert "engine-fault-suspected" in warnings
    assert "suspected engine fault — measured AL 1.02 is far outside the predicted range &lt;temperature 0.8&gt;" in warnings
    provenance = measured_html.split('id="provenance"')[1].split("</section>")[0]
    assert "draftfit verify results.json --top 2" in provenance


def test_segments_show_bucket_and_category(example, example_html):
    section = example_html.split('id="segments"')[1].split("</section>")[0]
    assert "By input-length bucket" in section and "By category" in section
    best = explore.best_per_candidate(example)[0]
    for name in best["segments_predicted"]["category"]:
        assert f"<td>{name}</td>" in section


@pytest.mark.parametrize(
    "exact, bound, ci, expected",
    [
        (True, (2.0, 2.0), (1.9, 2.1), []),
        (False, (1.6, 2.4), (1.9, 2.1), ["top-K bound on AL is wider than 10% of AL at k = 3"]),
        (True, (2.0, 2.0), (1.2, 2.8), ["95% CI of AL is wider than 25% of AL at k = 3"]),
        (False, (1.5, 2.5), (1.0, 3.0), ["top-K bound", "95% CI"]),
    ],
)
def test_wide_bounds_are_warned_about(exact, bound, ci, expected):
    from draftfit.report.render import _wide

    config = {"candidate": "d", "k": 3, "exact": exact, "al_predicted": 2.0, "al_bound_low": bound[0], "al_bound_high": bound[1],
              "al_ci_low": ci[0], "al_ci_high": ci[1], "per_concurrency": []}
    results = Results(run_id="r", created="c", provenance={}, study={"top_k_logprobs": 20}, candidates=[{"name": "d"}], configs=[config])
    notes = _wide(results)
    assert len(notes) == len(expected)
    for note, words in zip(notes, expected, strict=True):
        assert words in note


def test_a_run_with_nothing_ranked_still_renders():
    results = Results(run_id="r", created="2026-01-01T00:00:00Z", provenance={}, study={}, candidates=[{"name": "x", "draft": {"method": "eagle"}}],
                      skipped=[{"candidate": "x", "reason": "eagle heads are trained for one target"}])
    html = render_html(results)
    assert "No configuration was predicted" in html and "eagle heads are trained for one target" in html
    assert external_references(html) == []


# ---------------------------------------------------------------------------------------------
# escaping


def test_text_from_prompts_datasets_and_model_files_is_escaped(hostile_html):
    assert "<script" not in hostile_html.lower()
    assert SPECIAL not in hostile_html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in hostile_html
    assert "&lt;|im_start|&gt;" in hostile_html
    page = Page(hostile_html)
    assert not any(tag == "script" for tag, _ in page.tags)
    for section in ("tokenizers", "segments", "warnings", "provenance"):
        part = hostile_html.split(f'id="{section}"')[1].split("</section>")[0]
        assert "&lt;script&gt;" in part, section


def test_hostile_text_in_figures_stays_text(example):
    data = example.model_dump(mode="json")
    name = data["configs"][0]["candidate"]
    for config in data["configs"]:
        if config["candidate"] == name:
            config["candidate"] = HOSTILE
    for cand in data["candidates"]:
        if cand["name"] == name:
            cand["name"] = HOSTILE
    results = Results.model_validate(data)
    for image in svgs(render_html(results)):
        ET.fromstring(image)  # still well-formed XML
        assert "<script" not in image


# ---------------------------------------------------------------------------------------------
# files and the CLI


def test_write_report_and_determinism(example, tmp_path):
    path = write_report(example, tmp_path / "run")
    assert path == tmp_path / "run" / "report.html"
    first = path.read_text(encoding="utf-8")
    assert first == write_report(example, tmp_path / "run").read_text(encoding="utf-8")


def test_cli_report_rerenders_beside_the_results(tmp_path):
    results = tmp_path / "run" / "results.json"
    results.parent.mkdir()
    results.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    out = CliRunner().invoke(cli, ["report", str(results)])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "run" / "report.html").is_file()
    assert f"wrote {tmp_path / 'run' / 'report.html'}" in out.output
    other = tmp_path / "elsewhere" / "review.html"
    out = CliRunner().invoke(cli, ["report", str(results), "-o", str(other)])
    assert out.exit_code == 0 and other.is_file()
    assert "<title>draftfit report" in other.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "content, message, fix",
    [
        (lambda d: {**d, "schema_version": 99}, "results schema version 99 is not the version this draftfit reads (2)",
         "Re-run `draftfit rank` with draftfit"),
        (lambda d: {"run_id": "x"}, "not a draftfit results file (no schema_version)", "Pass a results.json written by `draftfit rank`"),
        (lambda d: "{truncated", "not a valid JSON results file", "Re-run `draftfit rank`"),
    ],
)
def test_cli_report_refuses_other_files_with_the_fix(tmp_path, content, message, fix):
    data = content(json.loads(EXAMPLE.read_text(encoding="utf-8")))
    path = tmp_path / "results.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    out = CliRunner().invoke(cli, ["report", str(path)])
    assert out.exit_code == 2
    assert out.output.startswith(f"Error: {path}: {message}") and fix in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert not (tmp_path / "report.html").exists()


def test_cli_report_missing_file(tmp_path):
    out = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.json")])
    assert out.exit_code == 2 and "no such file" in out.output


# ---------------------------------------------------------------------------------------------
# the public API behind the report and the notebook


def test_select_configs_by_name(example):
    best = explore.best_per_candidate(example)
    first = best[0]
    label = explore.config_label(first)
    assert explore.select(example, [label]) == [first]
    assert explore.select(example, f"{first['candidate']}:{first['k']}") == [first]
    assert explore.select(example, first["candidate"]) == [first]
    assert explore.select(example) == best
    with pytest.raises(Exception, match="no configuration 'nope k=9'.*Name a candidate"):
        explore.select(example, "nope k=9")


def test_tables_match_the_configs(example):
    config = explore.largest_k_per_candidate(example)[0]
    rows = explore.per_position(example, explore.config_label(config))
    assert [r["marginal"] for r in rows] == config["per_position_predicted"]
    assert [r["position"] for r in rows] == list(range(1, config["k"] + 1))
    speed = explore.speedup_vs_concurrency(example, explore.config_label(config))
    assert [r["concurrency"] for r in speed] == explore.concurrency_levels(example)
    assert [r["speedup"] for r in speed] == [p["speedup_predicted"] for p in config["per_concurrency"]]
    assert all(r["kind"] == "predicted" for r in rows + speed)
    ranked = [r["rank"] for r in explore.ranking(example) if r["rank"] is not None]
    assert ranked == sorted(ranked) == list(range(1, len(ranked) + 1))


def test_the_recommendation_says_when_verify_measured_a_faster_configuration(example):
    from draftfit.explore import measured_better

    text = measured_better(example)
    assert text == ("verify measured ngram-2-4 k=3 faster than the recommended ngram-2-4 k=2 at concurrency 1: "
                    "1.48× against 1.36× (measured, one run each)")
    assert f"<strong>Measured:</strong> {text}." in render_html(example).replace("&#215;", "×")
    faster = [dict(e, speedup_measured=9.0) if (e.get("candidate"), e.get("k")) == ("ngram-2-4", 2) else e
              for e in example.measured]
    assert measured_better(example.model_copy(update={"measured": faster})) is None
    unverified = [e for e in example.measured if (e.get("candidate"), e.get("k")) != ("ngram-2-4", 2)]
    assert "the recommended ngram-2-4 k=2 was not verified" in measured_better(example.model_copy(update={"measured": unverified}))
    none = example.model_copy(update={"recommendation": {**example.recommendation, "candidate": None, "k": None}})
    assert measured_better(none) == ("rank recommended serving without speculation, but verify measured ngram-2-4 k=3 "
                                     "faster than the baseline at concurrency 1: 1.48× (measured)")
    slower = [dict(e, speedup_measured=0.9) for e in example.measured]
    assert measured_better(none.model_copy(update={"measured": slower})) is None  # no speculation was right


def test_the_recommendation_is_held_to_its_deploy_command_where_verify_measured_it(example):
    """The example's deploy command runs k=2 up to 5 in flight and k=1 beyond: where verify measured
    that command, it, not k=2 alone, is what the recommendation is held to."""
    from draftfit.explore import measured_better

    def scheduled(speedup: float) -> list[dict]:
        sched = [dict(e, schedule=[[1, 5, 2], [6, 1024, 1]], speedup_measured=speedup, k_predicted=2)
                 for e in example.measured if (e.get("candidate"), e.get("k")) == ("ngram-2-4", 2)]
        return [*example.measured, *sched]

    assert measured_better(example.model_copy(update={"measured": scheduled(1.5)})) is None
    slower = example.model_copy(update={"measured": scheduled(1.4)})
    assert measured_better(slower) == ("verify measured ngram-2-4 k=3 faster than the recommended "
                                       "ngram-2-4 k=[1-5:2 6-1024:1] at concurrency 1: 1.48× against 1.40× (measured, one run each)")
    html = render_html(slower).replace("&#215;", "×")
    assert "ngram-2-4 k=[1-5:2 6-1024:1] at concurrency 1: 1.40×" in html


def test_deploy_commands_keep_their_text_and_mark_their_options(example):
    from draftfit.report.render import fmt_command

    shell = example.deploy["recommended"]["shell"]
    rendered = str(fmt_command(shell))
    assert unescape(re.sub(r"<[^>]+>", "", rendered)) == shell  # copied from the page, it is the command
    assert '<span class="flag">--speculative-config</span>' in rendered
    assert f"<pre><code>{rendered}</code></pre>" in render_html(example)


def test_machine_load_stands_beside_the_measured_numbers(example):
    html = render_html(example)
    section = html[html.index('<section id="measured">'):]
    section = section[:section.index("</section>")]
    load = example.measured[0]["machine_load_measured"]
    assert "machine load</th>" in section
    highest = max(load["load_avg_1m_before"], load["load_avg_1m_after"])
    assert f"{highest:.1f} / {load['cpus']} CPUs" in section


def test_model_free_configurations_at_0_gib_are_drawn_apart_by_candidate():
    from draftfit.report.plots import _dodge_zero

    points = [({"candidate": "ngram-a"}, 0.0, 1.5), ({"candidate": "ngram-a"}, 0.0, 1.4),
              ({"candidate": "ngram-b"}, 0.0, 1.5), ({"candidate": "draft"}, 2.0, 0.6)]
    dodged = _dodge_zero(points, ["ngram-a", "ngram-b", "draft"])
    xs = {c["candidate"]: x for c, x, _ in dodged}
    assert xs["ngram-a"] < xs["ngram-b"] and abs(xs["ngram-a"]) == abs(xs["ngram-b"]) <= 0.05 * 2.0
    assert xs["draft"] == 2.0 and [y for _, _, y in dodged] == [y for _, _, y in points]
    assert _dodge_zero(points[:2], ["ngram-a"]) == points[:2]  # one candidate at 0: nothing to separate
