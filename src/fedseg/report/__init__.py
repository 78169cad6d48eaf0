"""The human-readable reports (``report.html`` + ``figures/``) rendered from the files of a run or a study.

Its primitives live below the algorithms, in :mod:`fedseg.presentation` (``kit``: HTML, tables,
sections, the run's files as ``RunFiles``; ``figures``: PNG figures and the palette), so a method
family's own sections can use them; the pages here read the algorithm registry.

- ``methods``: display names, baselines, families and table order from summary.json and the registry;
- ``study_tables``: the unseen-site and sweep tables of a study directory as sections;
- ``html``: the run report (``render_report``), with the sections of each method family present;
- ``studies``: the study page (``render_study``), which re-renders its runs' reports.

Import the page you need (``from fedseg.report.html import render_report``); this package imports nothing.
"""
