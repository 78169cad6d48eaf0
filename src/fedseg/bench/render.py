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
    tune_table,
    tuning_counted,
    unseen_note,
    weights_table,
)
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
    "the same cells as tables.md, rendered from tables.json by `fedseg report` like it. Each caption carries the "
    "table's own notes; the legend that every table shares (what Δ, CI, p, † and ‡ are, what is paired with what) "
    "follows: put it, or a pointer to it, in your paper."
)


def latex(bench: BenchSpec, tables: dict, tuning: list[dict], changes: Sequence[str] = ()) -> str:
    """``tables.tex``: every table of :func:`sections` as a LaTeX float (:mod:`fedseg.presentation.latex`), the
    legend as comments at the top."""
    head = TEX_PREAMBLE.format(name=bench.name) + "\n\n" + notes(bench, tables, changes, tuning).replace("**", "")
    parts = [tex_comment(head)]
    for section in sections(bench, tables, tuning):
        short = f"{section.federation}: {section.short}"
        caption = " ".join([f"{short}.", *section.notes])
        label = tex_label("tab", bench.name, section.federation, section.short)
        parts.append(tex_table(*section.table, caption=caption, label=label, short=short))
    return "\n".join(parts)
