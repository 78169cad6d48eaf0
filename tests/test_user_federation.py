"""A federation from user code (in memory) is checked like a folder, and a resume must be given the same data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedseg import Experiment
from fedseg.data.federation import Case, FederationError, Site
from fedseg.data.user_federation import check_user_federation


def _with_case(fed, site: int, case: Case):
    sites = list(fed.sites)
    sites[site] = replace(sites[site], cases=[*sites[site].cases, case])
    return replace(fed, sites=sites)


def test_every_problem_of_an_in_memory_federation_is_named_before_anything_is_written(tmp_path, disc_federation):
    fed = disc_federation(n_sites=2, cases_per_site=3)
    image, label = fed.sites[0].cases[0].arrays()
    bad = [
        Case.from_arrays("shape", image[:, :16], label),  # label no longer lines up with its image
        Case.from_arrays("value5", image, np.where(label > 0, 5, 0).astype(np.uint8)),
        Case.from_arrays("fraction", image, label.astype(np.float32) / 2),
        Case.from_arrays("nan", np.where(label > 0, np.nan, image.astype(np.float32)), label),
        Case.from_arrays("nochannel", image[0], label),
        Case.from_arrays("twochannels", image[:2], label),
        Case.from_arrays("s1_000", image, label),  # the site already has this id
    ]
    for case in bad:
        fed = _with_case(fed, 0, case)
    fed = replace(fed, sites=[*fed.sites, Site("a/b", list(fed.sites[1].cases)), Site("empty", [])])
    out = tmp_path / "run"
    with pytest.raises(FederationError) as caught:
        Experiment({"algorithms": ["fedavg"], "data": {"image_size": 32}}, out, federation=fed, progress=False).run()
    text = str(caught.value)
    expected = [
        "site 'a/b': 'a/b' cannot name a file",
        "site 'empty': has no cases",
        "site 'site1': duplicate case ids ['s1_000']",
        "case 'shape': label shape (32, 32) differs from the image's spatial shape (16, 32)",
        "case 'value5': label values 5 are not in any region (regions use 1, 2; 0 is background)",
        "case 'fraction': label map is not integer",
        "case 'nan': image has",
        "case 'nochannel': image shape (32, 32) is not (channels, H, W) (2d)",
        "case 'twochannels': image has 2 channels, the federation says channels: 3",
    ]
    assert all(line in text for line in expected), text
    assert text.startswith("federation 'discs' (given by your code):") and "Traceback" not in text
    assert not out.exists()  # nothing written


def test_the_fingerprint_follows_the_arrays_ids_and_sites(disc_federation):
    fed = disc_federation(n_sites=2, cases_per_site=3)
    same = check_user_federation(disc_federation(n_sites=2, cases_per_site=3))
    assert check_user_federation(fed) == same and len(same) == 64
    image, label = (a.copy() for a in fed.sites[1].cases[2].arrays())
    image[0, 0, 0] += 1  # one pixel
    one_pixel = _with_case(
        replace(fed, sites=[fed.sites[0], replace(fed.sites[1], cases=fed.sites[1].cases[:2])]),
        1,
        Case.from_arrays(fed.sites[1].cases[2].id, image, label),
    )
    renamed = replace(fed, sites=[fed.sites[0], replace(fed.sites[1], name="site9")])
    assert len({same, check_user_federation(one_pixel), check_user_federation(renamed)}) == 3


def test_a_resume_is_refused_other_data_than_the_run_started_on(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"hd95": False, "local_models": False})
    fed = disc_federation(n_sites=2, cases_per_site=8)
    out = tmp_path / "run"
    Experiment(cfg, out, federation=fed, progress=False).run(report=False)
    with pytest.raises(ValueError, match=r"started on a federation given by your code \(.*\), not the configuration.s"):
        Experiment.from_run(out, progress=False).run(resume=True)  # would train on the built-in data.source
    other = disc_federation(n_sites=2, cases_per_site=8, seed=1)
    with pytest.raises(ValueError, match="the federation given is not the one this run started on"):
        Experiment.from_run(out, federation=other, progress=False).run(resume=True)
    again = Experiment.from_run(out, federation=fed, progress=False).run(resume=True)
    assert again.summary["dataset"] == "discs"

    builtin = tmp_path / "builtin"
    Experiment(cfg, builtin, progress=False).run(report=False)
    with pytest.raises(ValueError, match="started on the configuration's built-in data.source, not a federation given"):
        Experiment.from_run(builtin, federation=fed, progress=False).run(resume=True)
