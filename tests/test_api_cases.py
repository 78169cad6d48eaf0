"""``Results.cases`` (and ``dataframe``) refuse a filter value the run has none of, naming the ones it has, where a
typo (``metric="dicee"``) returned no rows and no word."""

from __future__ import annotations

import pytest

from fedseg import Results

ROWS = [
    ("ditto", "local:site1", "site1", "c1", "disc", "dice", "0.8"),
    ("ditto", "local:site1", "site1", "c1", "disc", "hd95", "3.0"),
    ("ditto", "local:site1", "site1", "c1", "disc", "nsd", "0.7"),
    ("fedavg", "global", "site1", "c1", "disc", "dice", "0.6"),
]
ENTRY = {"dice": {"client_avg": 0.8, "global": 0.8, "site1": 0.8}}


def _results(tmp_path) -> Results:
    lines = ["algorithm,model,site,case,region,metric,value", *(",".join(row) for row in ROWS)]
    (tmp_path / "results.csv").write_text("\n".join(lines) + "\n")
    return Results(tmp_path, {"sites": ["site1"], "algorithms": {"ditto": ENTRY, "fedavg": ENTRY}})


@pytest.mark.parametrize(
    "filters, said",
    [
        (
            {"metric": "dicee"},
            "cases(metric='dicee'): {out} has no metric 'dicee'; did you mean 'dice'? choose one of dice, hd95, nsd",
        ),
        (
            {"algorithm": "dittoo", "metric": "dice"},
            "cases(algorithm='dittoo'): {out} has no algorithm 'dittoo'; did "
            "you mean 'ditto'? choose one of ditto, fedavg",
        ),
        (
            {"algorithm": "scaffold"},
            "cases(algorithm='scaffold'): {out} has no algorithm 'scaffold'; choose one of ditto, fedavg",
        ),
        (
            {"model": "local:site9"},
            "cases(model='local:site9'): {out} has no model 'local:site9'; did you mean "
            "'local:site1'? choose one of local:site1, global",
        ),
    ],
)
def test_cases_names_an_unknown_filter_value_and_the_ones_there_are(tmp_path, filters, said):
    results = _results(tmp_path)
    with pytest.raises(ValueError) as raised:
        results.cases(**filters, scored=False)
    assert str(raised.value) == said.format(out=tmp_path)
    with pytest.raises(ValueError):
        results.cases(**filters, scored=True)


def test_cases_with_known_values_still_filters_and_may_be_empty(tmp_path):
    results = _results(tmp_path)
    assert [r["value"] for r in results.cases(algorithm="ditto", metric="hd95")] == [3.0]
    assert results.cases(algorithm="fedavg", metric="nsd") == []  # a metric the algorithm has no row of
    assert results.cases(algorithm="fedavg", model="local:site1") == []  # a model of another algorithm
    (tmp_path / "results.csv").unlink()  # no rows at all: the summary's algorithms and the metrics still checked
    assert results.cases(algorithm="ditto", metric="dice", model="global") == []
    with pytest.raises(ValueError, match=r"^cases\(metric='Dice'\): .* did you mean 'dice'\?"):
        results.cases(metric="Dice")
