"""The human-readable report (report.html + figures/) rendered from a run's files."""

from fedseg.report.html import render_report

__all__ = ["render_report"]
