"""What the report pages know about methods: display names, baseline or federated, families, table order.

Everything comes from the run's ``summary.json`` entry of a method (``display_name``,
``federated``, ``kind``, ``family``, written by runs since the algorithm registry) and, for
older runs or hand-made entries, from the registry (:mod:`fedseg.algorithms`); a name neither
knows is shown as it is and counted as federated. Used by the run report
(:mod:`fedseg.report.html`) and the study tables (:mod:`fedseg.report.study_tables`); the
presentation kit (:mod:`fedseg.presentation.kit`) stays free of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fedseg.algorithms import ALGORITHMS, AlgorithmSpec
from fedseg.algorithms.registry import Family

__all__ = ["algorithm_order", "display_name", "families", "family_name", "is_federated", "method_kind"]


def spec(name: str) -> AlgorithmSpec | None:
    """The registry entry of ``name`` (also under its lower-case, hyphenated spelling), or None."""
    return ALGORITHMS.get(name) or ALGORITHMS.get(name.lower().replace("_", "-"))


def display_name(name: str, entry: Mapping | None = None) -> str:
    """summary.json's ``display_name``, else the registry's, else ``name``."""
    if entry and entry.get("display_name"):
        return str(entry["display_name"])
    s = spec(name)
    return s.display_name if s else name


def is_federated(name: str, entry: Mapping | None = None) -> bool:
    """Federated = not a baseline: summary.json's ``federated`` or ``kind``, else the registry's kind,
    else True (an unknown method competes for bold)."""
    entry = entry or {}
    if "federated" in entry:
        return bool(entry["federated"])
    if entry.get("kind"):
        return entry["kind"] != "baseline"
    s = spec(name)
    return s.federated if s else True


def method_kind(name: str, entry: Mapping | None = None) -> str | None:
    """``baseline`` | ``global`` | ``personalized`` | ``clustered``: summary.json's ``kind``, else the
    registry's, else None (a name neither knows)."""
    if entry and entry.get("kind"):
        return str(entry["kind"])
    s = spec(name)
    return s.kind if s else None


def family_name(name: str, entry: Mapping | None = None) -> str | None:
    """The family ``name`` belongs to: summary.json's ``family`` (null = none), else the registry's."""
    if entry is not None and "family" in entry:
        return str(entry["family"]) if entry["family"] else None
    s = spec(name)
    return s.family_name if s else None


def _registry_families() -> dict[str, tuple[Family, list[str]]]:
    """``{family name: (Family, member names in registry order)}``, families in registry order."""
    out: dict[str, tuple[Family, list[str]]] = {}
    for s in ALGORITHMS.values():
        if s.family is not None:
            out.setdefault(s.family.name, (s.family, []))[1].append(s.name)
    return out


def algorithm_order(summary: Mapping) -> list[str]:
    """Table order of the FedSM paper (Table 3): centralized-type baselines, ``local``, ``fedavg``,
    the other federated methods (in the run's order), then the families (in registry order),
    each family's members together in registry order (FedSM, FedSM-extra, FedSM-ensemble)."""
    algs = summary.get("algorithms", {})
    known = _registry_families()
    fams = list(known) + [f for f in dict.fromkeys(family_name(a, algs[a]) for a in algs) if f and f not in known]

    def rank(a: str) -> tuple[int, ...]:
        entry = algs[a]
        if a.lower() == "local":
            return (1,)
        if not is_federated(a, entry):
            return (0,)
        fam = family_name(a, entry)
        if fam is None:
            return (2,) if a.lower() == "fedavg" else (3,)
        members = known[fam][1] if fam in known else []
        s = spec(a)
        return (4, fams.index(fam), members.index(s.name) if s is not None and s.name in members else len(members))

    return sorted(algs, key=rank)  # stable: the run's order within a rank (unregistered members: after the others)


def families(summary: Mapping, order: Sequence[str] | None = None) -> list[tuple[Family, list[str]]]:
    """The registered families among the run's algorithms, each with its members in table order
    (families in table order too). A family whose name the registry does not know is left out
    (nothing can render its sections)."""
    algs = summary.get("algorithms", {})
    known = _registry_families()
    out: dict[str, list[str]] = {}
    for a in order if order is not None else algorithm_order(summary):
        fam = family_name(a, algs.get(a, {}))
        if fam is not None and fam in known:
            out.setdefault(fam, []).append(a)
    return [(known[f][0], members) for f, members in out.items()]
