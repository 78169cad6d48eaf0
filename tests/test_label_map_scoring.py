"""What the metrics score (``eval.score_on``): the label map the thresholded channels paint (default), so that a
run's scores are the scores of the masks ``fedseg predict`` writes, or the channels as they are."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from fedseg.api import Experiment
from fedseg.config_load import ConfigError, dump_config, with_recorded_defaults
from fedseg.data.dataset import CaseSet
from fedseg.data.federation import Regions
from fedseg.engine.context import Task
from fedseg.evaluate.inference import score_caseset
from fedseg.evaluate.metrics import label_map_masks
from fedseg.run.checks import data_notes
from fedseg.run.preflight import resume_conflicts

BRATS = Regions.from_mapping({"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]})
FUNDUS = Regions.from_mapping({"disc": [1, 2], "cup": [2]})
ORGANS = Regions.from_mapping({"liver": [1], "spleen": [2]})
OVERLAPPING = Regions.from_mapping({"a": [1, 2], "b": [2, 3]})  # no paint order: the closest label value


@pytest.mark.parametrize("regions", [BRATS, FUNDUS, ORGANS, OVERLAPPING], ids=lambda r: "/".join(r.names))
@pytest.mark.parametrize("spatial", [(9, 7), (5, 6, 4)], ids=["2d", "3d"])
def test_label_map_masks_are_the_written_label_maps_regions(regions, spatial):
    rng = np.random.default_rng(len(regions.names) + len(spatial))
    masks = rng.random((3, len(regions.names), *spatial)) < 0.5
    painted = label_map_masks(torch.from_numpy(masks), regions)
    expected = np.stack([regions.one_hot(regions.to_label(m)) for m in masks]).astype(bool)
    assert painted.dtype == torch.bool and painted.shape == masks.shape
    np.testing.assert_array_equal(painted.numpy(), expected)
    np.testing.assert_array_equal(label_map_masks(painted, regions).numpy(), expected)  # a projection


class FixedLogits(nn.Module):
    """A "network" whose logits are fixed masks (+-10): the disc on the left half, the cup on a band across it."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.logits = torch.full((2, size, size), -10.0)
        self.logits[0, :, : size // 2] = 10.0  # disc: the left half
        self.logits[1, size // 4 : size // 2, :] = 10.0  # cup: a band, half of it outside the disc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1, -1, -1)


def test_a_cup_predicted_outside_the_disc_counts_for_the_disc_as_its_written_mask_does(tiny_config):
    """Scored as a label map, the cup pixels outside the predicted disc are painted cup (value 2, inside the disc):
    the disc's Dice is that of the written mask, not of its channel."""
    size = 8
    model = FixedLogits(size)
    truth = np.zeros((size, size), np.uint8)
    truth[:, : size // 2] = 1
    truth[size // 4 : size // 2, :] = 2  # the truth is the written label map of the prediction
    data = CaseSet("test", ["c1"], torch.zeros(1, 3, size, size), torch.from_numpy(FUNDUS.one_hot(truth)[None]).float())

    task = Task(tiny_config(), 2, 3, FUNDUS.names, FUNDUS.values)
    assert task.scored_regions == FUNDUS  # the default: eval.score_on = label_map
    as_written = score_caseset(model, data, 1, 0.5, False, torch.device("cpu"), regions=task.scored_regions)
    np.testing.assert_array_equal(as_written["dice"], [[1.0, 1.0]])

    channels = Task(tiny_config(eval={"score_on": "channels"}), 2, 3, FUNDUS.names, FUNDUS.values)
    assert channels.scored_regions is None
    as_channels = score_caseset(model, data, 1, 0.5, False, torch.device("cpu"), regions=channels.scored_regions)
    disc, written_disc = size * size // 2, size * size // 2 + size * size // 8  # the channel misses the band's half
    assert as_channels["dice"][0, 0] == pytest.approx(2 * disc / (disc + written_disc))
    assert as_channels["dice"][0, 1] == 1.0


def test_a_run_recorded_before_score_on_resumes_scoring_its_channels():
    """A run written before ``eval.score_on`` scored the channels: its recorded configuration reads as
    ``channels``, so its resume keeps that scoring (the new default is refused as a change, not mixed in)."""
    old = {"eval": {"threshold": 0.5}, "data": {"source": "folder", "root": "/data/fed"}}
    assert with_recorded_defaults(old)["eval"] == {"threshold": 0.5, "score_on": "channels", "score_grid": "model"}
    recorded = with_recorded_defaults(old)
    now = {**recorded, "eval": {"threshold": 0.5, "score_on": "label_map", "score_grid": "original"}}
    assert resume_conflicts(recorded, now) == [
        "eval.score_grid: model -> original",
        "eval.score_on: channels -> label_map",
    ]
    assert with_recorded_defaults(now) == now
    before_grid = {**old, "eval": {"threshold": 0.5, "score_on": "label_map"}}  # written between the two options
    assert with_recorded_defaults(before_grid)["eval"] == {**before_grid["eval"], "score_grid": "model"}


@pytest.mark.parametrize(
    "data",
    [{"volume": {"patch_size": [32, 32, 32]}, "source": "folder", "root": "/d"}, {"source": "synthetic-retina"}, {}],
    ids=["volume-path", "2d-builtin", "default-source"],
)
def test_an_old_run_whose_scores_the_grid_does_not_change_still_matches(data):
    """The volume path always scored each case's own grid, and the 2D built-in federations are generated at
    data.image_size: an old run of either reads as eval.score_grid: original, so a bench keeps its finished runs and
    a resume goes on (a review: every old bench run would have been trained again)."""
    old = {"eval": {"threshold": 0.5}, "data": data}
    assert with_recorded_defaults(old)["eval"]["score_grid"] == "original"


def test_a_fixed_worst_hd95_on_a_folder_federation_is_said_at_the_start(tiny_config):
    """The fets presets fix eval.hd95_worst at BraTS's diagonal (373.13 mm): on a folder of other volumes every miss
    scores that, which the run now says once (and the report's legend gives the value)."""
    fixed = tiny_config(data={"source": "folder", "root": "/data/fed"}, eval={"hd95_worst": 373.13})
    (line,) = data_notes(fixed, "2d")
    assert "scores HD95 373.13 on every case (eval.hd95_worst" in line and "eval.hd95_worst=null" in line
    assert data_notes(tiny_config(data={"source": "folder", "root": "/data/fed"}), "2d") == []
    assert data_notes(tiny_config(eval={"hd95_worst": 373.13}), "2d") == []  # a built-in federation: its own value
    no_hd95 = tiny_config(data={"source": "folder", "root": "/data/fed"}, eval={"hd95_worst": 373.13, "hd95": False})
    assert data_notes(no_hd95, "2d") == []  # no HD95 computed (eval.hd95: false): a scale study saw the note anyway


def test_ct_normalized_otherwise_than_in_hounsfield_windows_is_said_at_the_start(tiny_config):
    """An MSD CT import trained with min-max (or MR's z-scoring) without a word (a fresh-eyes 3D CT study)."""
    folder = {"source": "folder", "root": "/data/fed"}
    (line,) = data_notes(tiny_config(data=folder), "2d", ["CT"])
    assert "the images are CT (federation.yaml channel_names) but data.normalize is minmax" in line
    assert "--set data.normalize=ct" in line
    windows = {**folder, "normalize": "ct", "ct_windows": [[-200, 300, 50, 100]]}
    assert data_notes(tiny_config(data=windows), "2d", ["CT"]) == []
    assert data_notes(tiny_config(data=folder), "2d", ["T2", "ADC"]) == []


def test_an_old_run_reopened_from_python_keeps_its_channel_scoring(tmp_path, tiny_config):
    """``Experiment.from_run(out).run(resume=True)`` read config.yaml as written: an old run's missing
    ``eval.score_on`` became the new default and its resume was refused."""
    recorded = yaml.safe_load(dump_config(tiny_config()))
    del recorded["eval"]["score_on"], recorded["eval"]["score_grid"]
    recorded["data"].update(source="folder", root=str(tmp_path))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recorded))
    config = Experiment.from_run(tmp_path).config
    assert (config.eval.score_on, config.eval.score_grid) == ("channels", "model")


def test_a_task_without_region_values_refuses_to_score_a_label_map(tiny_config):
    task = Task(tiny_config(), 2, 3, FUNDUS.names)  # enough to build a model, not to score
    with pytest.raises(ValueError, match="needs each region's label values"):
        _ = task.scored_regions
    assert Task(tiny_config(eval={"score_on": "channels"}), 2, 3, FUNDUS.names).scored_regions is None


def test_a_bad_recorded_config_reopened_from_python_is_named_with_its_file(tmp_path, tiny_config):
    recorded = yaml.safe_load(dump_config(tiny_config()))
    recorded["fl"]["rounds"] = 0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recorded))
    with pytest.raises(ConfigError, match=r"config\.yaml.*fl\.rounds"):
        Experiment.from_run(tmp_path)


def test_sites_of_other_voxel_sizes_on_the_volume_path_are_said_at_the_start(tiny_config):
    """A scale study trained a 1x1x3 mm site on 32-voxel patches (32x32x96 mm) next to 1 mm sites without a word;
    nothing is said where the sizes agree, with one site, or with data.volume.spacing set (every case resampled)."""
    from fedseg.run.checks import spacing_notes

    volume = {"volume": {"patch_size": 32}}
    cfg = tiny_config(data=volume)
    sites = {
        "hospA": [(1.0, 1.0, 1.0)] * 3,
        "hospB": [(0.9, 0.9, 1.2)] * 2,
        "hospC": [(1.0, 1.0, 3.0), (1.0, 1.0, 2.8)],
    }
    (line,) = spacing_notes(cfg, sites)
    assert "(hospA: 1x1x1 mm, hospC: 1x1x2.9 mm, medians) and data.volume.spacing is unset" in line
    assert spacing_notes(cfg, {k: v for k, v in sites.items() if k != "hospC"}) == []  # within 1.5x
    assert spacing_notes(cfg, {"hospC": sites["hospC"]}) == []
    assert spacing_notes(tiny_config(data={"volume": {"patch_size": 32, "spacing": 1.0}}), sites) == []
    assert spacing_notes(tiny_config(), sites) == []  # the whole-image path resizes every case anyway
