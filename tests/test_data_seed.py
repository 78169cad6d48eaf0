"""``data.seed`` (the dataset's seed) apart from the run ``seed`` (the training's): the same case id is the same image
and the same split under every run seed of a study; the training still differs between run seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedseg.config import RunConfig
from fedseg.config_load import load_config, with_recorded_data_seed
from fedseg.models.factory import build_segmenter
from fedseg.run import prepare
from fedseg.run.preflight import resume_conflicts

SMALL = ["data.scale=0.05", "data.image_size=16", "model.channels=[4,8,16]"]


def _prepared(*overrides: str):
    return prepare(load_config(preset="synthetic-retina", overrides=[*SMALL, *overrides]))


def _images(prep) -> dict[tuple[str, str], np.ndarray]:
    return {(s.name, c.id): c.arrays()[0] for s in prep.federation.sites for c in s.cases}


@pytest.fixture(scope="module")
def seed0():
    return _prepared("seed=0")


def test_run_seeds_share_the_images_and_the_split(seed0):
    seed1 = _prepared("seed=1")
    a, b = _images(seed0), _images(seed1)
    assert a.keys() == b.keys()
    for key, image in a.items():
        np.testing.assert_array_equal(image, b[key])
    assert seed0.splits == seed1.splits


def test_another_data_seed_changes_the_images_and_the_split(seed0):
    other = _prepared("seed=0", "data.seed=1")
    a, b = _images(seed0), _images(other)
    common = a.keys() & b.keys()
    assert common and any(not np.array_equal(a[k], b[k]) for k in common)
    assert seed0.splits != other.splits


def test_iid_dealing_follows_the_data_seed():
    deal = ["data.repartition.mode=iid", "data.repartition.sites=3"]
    first, second, other = _prepared("seed=0", *deal), _prepared("seed=1", *deal), _prepared("data.seed=1", *deal)
    cases = [{s.name: [c.id for c in s.cases] for s in p.federation.sites} for p in (first, second, other)]
    assert cases[0] == cases[1] != cases[2]


def test_the_initial_weights_still_follow_the_run_seed():
    cfg = RunConfig()
    w0, w1 = (build_segmenter(cfg.model, 2, 3, 1, seed).state_dict() for seed in (0, 1))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0 if w0[k].is_floating_point())


def test_an_old_recorded_config_resumes_with_the_data_of_its_run_seed():
    new = {"seed": 1, "data": {"seed": 0, "source": "synthetic-retina"}}
    old = {"seed": 1, "data": {"source": "synthetic-retina"}}  # written before data.seed: data came from seed 1
    assert resume_conflicts(with_recorded_data_seed(old), new) == ["data.seed: 1 -> 0"]
    assert resume_conflicts(with_recorded_data_seed(old), {**new, "data": {**new["data"], "seed": 1}}) == []
    old0 = {"seed": 0, "data": {"source": "synthetic-retina"}}
    assert resume_conflicts(with_recorded_data_seed(old0), {**new, "seed": 0}) == []
    assert with_recorded_data_seed(new) is new
