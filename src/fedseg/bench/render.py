"""A bench's tables rendered: :func:`sections` (every table of :mod:`fedseg.bench.table_rows`, per federation, with its
title and notes) as ``tables.md`` (:func:`markdown`), ``tables.tex`` (:func:`latex`) and the parts of ``report.html``
with its per-site figures (:func:`html_parts`), each after the legend (:func:`fedseg.bench.legend.notes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedseg.bench.legend import notes
from fedseg.bench.spec import BenchSpec
from fedseg.bench.table_rows import (
    COMPARISONS,
    LEARNED_WEIGHTS,
    RANKS,
    TUNING_CONVERGED,
    budget_note,
    comparison_table,
    cost_table,
    not_converged,
    plateau_note,
    rank_table,
    routing_note,
    scoring_note,
    site_table,
    test_table,
    test_table_parts,
    tune_table,
    tuning_counted,
    unseen_note,
    weights_table,
)
from fedseg.evaluate.stats import RESAMPLES
from fedseg.presentation import kit
from fedseg.presentation.figures import per_site_bars
from fedseg.presentation.latex import tex_comment, tex_label, tex_table


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


@dataclass
class Section:
    """One table of a federation as every output shows it: ``title`` (tables.md's heading), ``short`` (report.html's
    and tables.tex's: ``FED: short``), the table ``(head, rows)``, its ``notes`` (paragraphs, Markdown ``**bold**``;
    tables.md puts them before the table where ``notes_first``, after it otherwise)."""

    federation: str
    title: str
    short: str
    table: tuple[list[str], list[list[str]]]
    notes: list[str] = field(default_factory=list)
    notes_first: bool = False


def sections(bench: BenchSpec, tables: dict, tuning: list[dict]) -> list[Section]:
    """Every table of the bench, per federation in the order the outputs show them."""
    out = []
    for fed, t in tables.items():
        budget = budget_note(t, bench.reference, bench.budget.rule)
        notes = (scoring_note(t), unseen_note(t), budget, plateau_note(t), routing_note(t))
        test_notes = [not_converged(t), *filter(None, notes)]
        tuned = [r for r in tuning if r["federation"] == fed]  # a tied selection's mark
        out += [
            Section(fed, "Test (FeTS Table 1 layout)", "test", test_table(t, bench.reference, tuned), test_notes),
            Section(
                fed,
                "Per site (FedSM Tables 3-4, Auto-FedAvg Table 2 layout)",
                "per site",
                site_table(t, bench.reference),
            ),
        ]
        if any(s.get("learned_weights") for s in t["methods"].values()):
            title = "Learned aggregation weights (Auto-FedAvg)"
            out.append(Section(fed, title, "learned weights", weights_table(t), [LEARNED_WEIGHTS]))
        out.append(Section(fed, "Cost (FeTS Table 2 layout)", "cost", cost_table(t)))
        if t.get("comparisons"):
            out.append(
                Section(fed, "Paired comparisons", "paired comparisons", comparison_table(t), [COMPARISONS], True)
            )
        if t.get("rank_stability"):
            out.append(Section(fed, "Rank stability", "rank stability", rank_table(t), [RANKS], True))
        if any(r["federation"] == fed for r in tuning):
            note = [TUNING_CONVERGED] if tuning_counted(tuning, fed) else []
            out.append(Section(fed, "Tuning on validation", "tuning on validation", tune_table(tuning, fed), note))
    return out


def markdown(bench: BenchSpec, tables: dict, tuning: list[dict], changes: Sequence[str] = ()) -> str:
    parts = [f"# Bench {bench.name}", "", notes(bench, tables, changes, tuning), ""]
    federation = None
    for section in sections(bench, tables, tuning):
        if section.federation != federation:
            federation = section.federation
            parts += [f"## {federation}", ""]
        notes_text = "\n\n".join(section.notes)
        parts += [f"### {section.title}", ""]
        parts += [notes_text, ""] if section.notes_first else []
        parts += [_md_table(*section.table), ""]
        parts += [notes_text, ""] if section.notes and not section.notes_first else []
    return "\n".join(parts) + "\n"


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    return kit.table(
        "<tr>" + "".join(f"<th>{kit.esc(h)}</th>" for h in head) + "</tr>",
        [
            "<tr><th>" + kit.esc(r[0]) + "</th>" + "".join(f"<td>{kit.esc(c)}</td>" for c in r[1:]) + "</tr>"
            for r in rows
        ],
    )


def html_parts(
    bench: BenchSpec,
    tables: dict,
    tuning: list[dict],
    fig_dir: Path,
    changes: Sequence[str] = (),
) -> list[str]:
    """The HTML parts of the bench's ``report.html``, its figures drawn into ``fig_dir``."""
    parts = [
        f"<h1>Bench {kit.esc(bench.name)}</h1>",
        f'<p class="meta">{kit.esc_md(notes(bench, tables, changes, tuning))}</p>',
    ]
    for section in sections(bench, tables, tuning):
        fed = section.federation
        note = kit.esc_md(" ".join(section.notes))
        parts.append(kit.section(f"{fed}: {section.short}", _html_table(*section.table), note))
        if section.short == "per site":
            t = tables[fed]
            fig = per_site_bars(
                {n: {s: v["mean"] for s, v in m["sites"].items()} for n, m in t["methods"].items()},
                t["sites"],
                {} if t.get("leave_one_out") else t["methods"][next(iter(t["methods"]))]["train_samples"],
                fig_dir / f"sites_{fed}.png",
                errors={n: {s: v["std"] for s, v in m["sites"].items()} for n, m in t["methods"].items()},
                title=f"{fed}: test Dice per site (mean ± std over seeds)",
            )
            if fig is not None:
                parts.append(f'<img src="figures/{fig.name}" alt="per-site Dice">')
    return parts


TEX_PREAMBLE = (
    "tables.tex of bench {name}: its tables as LaTeX (\\input{{tables.tex}}; needs \\usepackage{{booktabs,graphicx}}), "
    "the same cells as tables.md (the test table cut by columns into three: scores, Dice paired, HD95 and NSD "
    "paired), rendered from tables.json by `fedseg report` like it. Each caption says what its cells are and carries "
    "the table's own notes; the legend that every table shares (what Δ, CI, p, † and ‡ are, what is paired with what) "
    "follows: put it, or a pointer to it, in your paper."
)


#: What a table's cells are, opening its caption in tables.tex (a paper shows captions, not the legend's comments;
#: tables.md and report.html print the legend above the tables). Keys: a section's ``short``, or the test table's
#: parts (:func:`fedseg.bench.table_rows.test_table_parts`); tables whose notes say it have none.
TEX_DEFINITIONS = {
    "scores": "Test scores (Dice, overall and per region, HD95 and NSD where shown): mean ± std over the test cases of "
    "all folds, each case averaged over the seeds first; client avg: the mean of the per-site means, ± std over "
    "seeds; runs: finished of planned; rounds trained (mean ± std over runs) and SGD steps (mean); converged: runs "
    "whose selected round lies before the last 10% (at least 2) of their rounds or whose validation plateaued.",
    "paired": "Test Dice paired with {reference} per case and seed: Δ, the mean over the paired cases of (method − "
    "{reference}); 95% CI: percentile interval of Δ over {resamples} hierarchical bootstrap samples (sites, cases "
    "within them, seeds); Δ per seed: sN is run seed N's; p: {alternative} Wilcoxon signed-rank test over cases "
    "(each averaged over the seeds), Holm-adjusted over the column; †: the CI excludes 0 and the adjusted p < 0.05 "
    "(never with one seed, nor where (mean and ranks disagree): the signed ranks favour the other side than Δ); "
    "°: too few cases for any p < 0.05; ‡: Δ pairs fewer cases or runs than the scores average; (seeds disagree): "
    "the Δ per seed do not all share Δ's sign. The whole legend opens tables.tex (as comments).",
    "paired surface": "HD95 (lower is better: its test's alternative reversed) and NSD paired with {reference} as the "
    "Dice comparison: Δ, 95% CI and p, Holm-adjusted over each column.",
    "per site": "Test Dice per site: the site's mean over its test cases, mean ± std over seeds; † / °: its paired "
    "test against {reference} on that site's cases, Holm-adjusted over every cell; client avg: the mean of the site "
    "means; local avg / local gen: each site's own local model on its own test cases / on the other sites' (methods "
    "with local models; each run's mean over its sites, per seed the mean over its folds, ± std over seeds).",
    "cost": "Cost per run (mean over runs): rounds trained, SGD steps (FeTS Eq. 34), parallel SGD steps (Eq. 35), "
    "floats sent in training per site and over all sites, floats of evaluation messages per site, simulated hours "
    "(Eq. 36-38).",
    "tuning on validation": "Every setting of the grids: its validation Dice (which selects), its test Dice (shown, "
    "never used), runs, rounds and SGD steps, the rounds where the plateau rule stopped its runs, the selection.",
}
TEX_PART_TITLES = {"scores": "test", "paired": "test, paired with {reference}", "paired surface": "test, HD95 and NSD"}


@dataclass
class TexFloat:
    """One table of tables.tex: its ``caption``, ``short`` caption (the list of tables' entry), ``label`` and
    ``table`` ``(head, rows)``."""

    caption: str
    short: str
    label: str
    table: tuple[list[str], list[list[str]]]


def tex_floats(bench: BenchSpec, tables: dict, tuning: list[dict]) -> list[TexFloat]:
    """Every float of tables.tex: the tables of :func:`sections`, the test table cut into its parts
    (``test_table_parts``; the part of the scores keeps the test table's label, the Dice comparison its notes,
    cautions about Δ), each caption opening with what its cells are (:data:`TEX_DEFINITIONS`)."""
    alternative = bench.tests.alternative
    words = {
        "reference": bench.reference,
        "resamples": RESAMPLES,
        "alternative": "two-sided" if alternative == "two-sided" else f"one-tailed ({alternative})",
    }
    floats = []
    for section in sections(bench, tables, tuning):
        parts = [(section.short, section.short, section.table)]
        if section.short == "test":
            parts = [
                (key, TEX_PART_TITLES[key].format(**words), table)
                for key, table in test_table_parts(section.table, bench.reference)
            ]
        for key, title, table in parts:
            short = f"{section.federation}: {title}"
            defined = TEX_DEFINITIONS.get(key, "").format(**words)
            notes = section.notes if key in ("paired", section.short) else []  # the test's cautions are about Δ
            caption = " ".join([f"{short}.", *filter(None, [defined]), *notes])
            label_key = "test" if key == "scores" else key if section.short == "test" else section.short
            label = tex_label("tab", bench.name, section.federation, label_key)
            floats.append(TexFloat(caption, short, label, table))
    return floats


def latex(bench: BenchSpec, tables: dict, tuning: list[dict], changes: Sequence[str] = ()) -> str:
    """``tables.tex``: every float of :func:`tex_floats` as a LaTeX table (:mod:`fedseg.presentation.latex`), the
    legend as comments at the top."""
    head = TEX_PREAMBLE.format(name=bench.name) + "\n\n" + notes(bench, tables, changes, tuning).replace("**", "")
    parts = [tex_comment(head)]
    for f in tex_floats(bench, tables, tuning):
        parts.append(tex_table(*f.table, caption=f.caption, label=f.label, short=f.short))
    return "\n".join(parts)
