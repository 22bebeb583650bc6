"""The HTML report: one self-contained file per run, rendered from results.json.

    from draftfit.report import write_report, render_file
    write_report(results, "reports/RUN")          # -> reports/RUN/report.html
    render_file("reports/RUN/results.json", "review.html")

Importing this package is light (no torch, vLLM or matplotlib); figures are drawn when a report is
rendered (:mod:`draftfit.report.plots`, which the notebook also uses). The tables behind the report
are in :mod:`draftfit.explore`.
"""

from __future__ import annotations

from draftfit.report.render import (
    REPORT_NAME,
    SECTIONS,
    context,
    render_file,
    render_html,
    write_html,
    write_report,
)

__all__ = ["REPORT_NAME", "SECTIONS", "context", "render_file", "render_html", "write_html", "write_report"]
