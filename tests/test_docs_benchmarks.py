"""README's Performance section quotes the latest full run: the figures of REPORT.md's verdict
table and its date. A run committed without them left the README calling the run before it,
on another machine, the one REPORT.md holds."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

REPORT = REPO_ROOT / "benchmarks" / "results" / "REPORT.md"
LATEST = re.compile(r"\*\*Latest full run\*\*(.*?)(?:The run before|\n\n)", re.DOTALL)
VERDICT_ROW = re.compile(r"^\| (?:[A-Z]+) \| [^|]+ \| ([\d.,]+) \| ", re.MULTILINE)


def test_readme_quotes_the_reports_latest_run() -> None:
    report = REPORT.read_text()
    dates = set(re.findall(r"run of (\d{4}-\d{2}-\d{2})", report.split("\n\n", 2)[1]))
    figures = VERDICT_ROW.findall(report)
    assert len(dates) == 1 and len(figures) >= 10, (dates, figures)  # parsed
    paragraph = LATEST.search((REPO_ROOT / "README.md").read_text())
    assert paragraph is not None, "README lost its **Latest full run** paragraph"
    text = paragraph.group(1)
    assert dates <= set(re.findall(r"\d{4}-\d{2}-\d{2}", text)), "not the report's run"
    missing = [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text)]
    assert missing == [], "REPORT.md's measured figures the README's latest run does not quote"
