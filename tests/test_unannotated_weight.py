"""A training case without an annotated voxel (a federation with an ignore label, every voxel of its label the
ignore value) trains nothing: it is left out of its site's training set (``fedseg.data.dataset.build_site_data``,
``trains_nothing``), so FedAvg's aggregation weight n_k (``num_examples``), the declared training-set size
(``engine.num_samples``, ``summary.json`` ``train_samples``) and every sampler and budget count only the cases the
site trains on, whether or not ``data check`` marked the case (``meta[UNANNOTATED]``); the run says so in one line
per site as it starts. Validation and test cases are kept. Without an ignore label nothing changes."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from fedseg.config import SplitConfig
from fedseg.data.check import check_folder
from fedseg.data.federation import UNANNOTATED, FederationError
from fedseg.data.folder import load_folder
from fedseg.data.splits import make_splits, split_sizes
from test_ignore_label import SIZE, import_folder, nifti_dataset, png_dataset

UNANNOTATED_A = 3  # training cases of site A whose label is made all ignore


def _train_ids(out: Path, site: str) -> list[str]:
    splits = make_splits(load_folder(out), SplitConfig(), 0)[site]
    return sorted(cid for cid, s in splits.items() if s == "train")


@pytest.fixture(scope="module")
def scribbles(tmp_path_factory) -> tuple[Path, list[str]]:
    """An imported 2D federation (sites A and B, 10 partly annotated PNG cases each, ignore label 2) in which
    :data:`UNANNOTATED_A` of site A's training cases hold only the ignore label; ``(folder, those case ids)``."""
    tmp = tmp_path_factory.mktemp("scribbles")
    out = import_folder(png_dataset(tmp / "Dataset611_Scribbles", per_site=10), tmp / "fed")
    blank = _train_ids(out, "A")[:UNANNOTATED_A]
    for cid in blank:
        Image.fromarray(np.full((SIZE, SIZE), 2, np.uint8)).save(out / "A" / "labels" / f"{cid}.png")
    return out, blank


def _first_round(cfg, fed):
    """One real FedAvg training exchange on ``fed`` prepared under ``cfg``: ``(prepared, engine, replies)``."""
    from fedseg.algorithms import get_algorithm
    from fedseg.engine.simulator import Simulator
    from fedseg.run.preparation import prepare

    prep = prepare(cfg, fed)
    spec = get_algorithm("fedavg")
    options = spec.parse_options({})
    engine = Simulator(spec.name, spec.client(), prep.site_data, prep.task, options)
    engine.round = 1
    server = spec.server(engine, prep.task, options)
    replies = engine.exchange({s: server.train_message(s) for s in engine.sites}, "train")
    return prep, engine, replies


@pytest.mark.parametrize("checked", [False, True], ids=["from-the-prepared-label", "data-check-verdict"])
def test_a_sites_weight_counts_only_its_annotated_training_cases(scribbles, tiny_config, checked):
    out, blank = scribbles
    train_a, train_b = _train_ids(out, "A"), _train_ids(out, "B")
    fed = check_folder(out, SplitConfig(), 0) if checked else load_folder(out)
    assert all(bool(c.meta.get(UNANNOTATED)) == (checked and c.id in blank) for c in fed.site("A").cases)
    prep, engine, replies = _first_round(tiny_config(algorithms=["fedavg"], data={"image_size": 16}), fed)
    data = {d.name: d for d in prep.site_data}
    assert sorted(data["A"].train.ids) == sorted(set(train_a) - set(blank))
    assert data["A"].unannotated_train == UNANNOTATED_A and data["B"].unannotated_train == 0
    assert sorted(data["B"].train.ids) == train_b
    expected = {"A": len(train_a) - UNANNOTATED_A, "B": len(train_b)}
    assert {s: replies[s].meta["num_examples"] for s in ("A", "B")} == expected  # n_k
    assert {s: engine.num_samples(s) for s in ("A", "B")} == expected  # the declared size the reply is checked by
    assert {s: replies[s].meta["samples"] for s in ("A", "B")} == expected  # one epoch: each trained case once
    # the data check's count of a site's training cases (a Flower site's declaration) is the same
    checked_fed = check_folder(out, SplitConfig(), 0)
    splits = make_splits(checked_fed, SplitConfig(), 0)
    assert {s: split_sizes(checked_fed.site(s), splits[s])["train"] for s in ("A", "B")} == expected
    # validation and test are as they were: every case of them
    assert all(len(data[s].val) + len(data[s].test) + len(data[s].train) == 10 - (s == "A") * 3 for s in data)


def test_the_run_says_so_at_its_start_and_its_summary_counts_the_trained_cases(scribbles, tiny_config, tmp_path):
    from fedseg.api import Experiment

    out, _ = scribbles
    train_a, train_b = _train_ids(out, "A"), _train_ids(out, "B")
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16}, fl={"rounds": 1}, eval={"local_models": False})
    run = tmp_path / "run"
    Experiment(cfg, run, federation=load_folder(out), progress=False).run(report=False)
    said = [line for line in (run / "run.log").read_text().splitlines() if "no annotated voxel" in line]
    assert len(said) == 1, said
    assert said[0].endswith(
        f"note: site A: {UNANNOTATED_A} of {len(train_a)} training cases have no annotated voxel (only the ignore "
        "label): not trained on and not counted in its aggregation weight"
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithms"]["fedavg"]["train_samples"] == {"A": len(train_a) - UNANNOTATED_A, "B": len(train_b)}


def test_a_wholly_unannotated_case_padded_into_the_input_is_known_without_the_data_check(tmp_path, tiny_config):
    """``data.resize: pad`` places a non-square image in the input with known background around it: a case of only
    the ignore label then holds known voxels, the padding's, and is still left out; a partly annotated non-square
    case is kept."""
    from fedseg.run.preparation import prepare

    out = import_folder(png_dataset(tmp_path / "Dataset612_Scribbles", per_site=10), tmp_path / "fed")
    blank, partly = _train_ids(out, "A")[:2]
    rng = np.random.default_rng(3)
    for cid in (blank, partly):
        label = np.full((SIZE, SIZE // 2), 2, np.uint8)
        if cid == partly:
            label[:4, :4] = 1  # a few annotated voxels in a corner
        Image.fromarray(label).save(out / "A" / "labels" / f"{cid}.png")
        Image.fromarray(rng.integers(20, 200, (SIZE, SIZE // 2), dtype=np.uint8)).save(
            out / "A" / "images" / f"{cid}.png"
        )
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16, "resize": "pad"})
    for fed in (load_folder(out), check_folder(out, SplitConfig(), 0)):
        site = next(d for d in prepare(cfg, fed).site_data if d.name == "A")
        assert blank not in site.train.ids and partly in site.train.ids
        assert site.unannotated_train == 1


def test_the_volume_path_leaves_out_a_volume_of_only_the_ignore_label(tmp_path, tiny_config):
    from fedseg.run.preparation import prepare

    out = import_folder(nifti_dataset(tmp_path / "Dataset613_Sparse", per_site=6), tmp_path / "fed")
    blank = _train_ids(out, "X")[0]
    path = out / "X" / "labels" / f"{blank}.nii.gz"
    img = nib.load(path)
    nib.save(nib.Nifti1Image(np.full(img.shape, 3, np.uint8), img.affine), path)
    cfg = tiny_config(
        algorithms=["fedavg"],
        data={"image_size": 16, "volume": {"patch_size": 16}, "normalize": "zscore_channel"},
    )
    sites = {d.name: d for d in prepare(cfg, load_folder(out)).site_data}
    assert blank not in sites["X"].train.ids and sites["X"].unannotated_train == 1
    assert sites["X"].train.volumes is not None and len(sites["X"].train.volumes) == len(sites["X"].train)
    assert sites["Y"].unannotated_train == 0 and len(sites["Y"].train) == len(_train_ids(out, "Y"))


def test_a_site_left_with_no_annotated_training_case_is_refused(tmp_path, tiny_config):
    from fedseg.run.preparation import prepare

    out = import_folder(png_dataset(tmp_path / "Dataset614_Scribbles", per_site=8), tmp_path / "fed")
    for cid in _train_ids(out, "B"):
        Image.fromarray(np.full((SIZE, SIZE), 2, np.uint8)).save(out / "B" / "labels" / f"{cid}.png")
    with pytest.raises(FederationError, match="site 'B': none of its .* training cases has an annotated voxel"):
        prepare(tiny_config(algorithms=["fedavg"], data={"image_size": 16}), load_folder(out))


def test_without_an_ignore_label_every_training_case_is_kept(tiny_config, disc_federation):
    from fedseg.run.preparation import prepare

    fed = disc_federation()
    prep = prepare(tiny_config(), fed)
    splits = make_splits(fed, tiny_config().data.split, tiny_config().data.seed)
    for data in prep.site_data:
        assert data.unannotated_train == 0
        assert data.train.ids == [cid for cid, s in splits[data.name].items() if s == "train"]


def test_a_flower_site_trains_on_the_training_cases_it_declares_where_a_resize_loses_a_scribble(tmp_path, tiny_config):
    """A case whose only annotated voxel the resize to the model's input drops: the data check (which reads the label
    file) counts it as annotated, the prepared label has none left. A Flower site declares its training size by the
    check (``on_info``, ``split_sizes``) and built its data without it (the prepared label decided): one case fewer
    than declared, and the coordinator refused every reply of the site (the review's point). Its data is now built
    with the check's verdict where the federation has an ignore label: it trains on what it declares."""
    from fedseg.data.dataset import build_site_data
    from fedseg.flower import node

    out = import_folder(png_dataset(tmp_path / "Dataset613_Dots", per_site=10), tmp_path / "fed")
    dotted = _train_ids(out, "A")[0]
    dot = np.full((SIZE, SIZE), 2, np.uint8)
    dot[2, 2] = 1  # one annotated voxel, which a resize from 24 to 8 leaves out
    Image.fromarray(dot).save(out / "A" / "labels" / f"{dotted}.png")
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 8})
    fed = load_folder(out)
    splits = make_splits(fed, cfg.data.split, cfg.data.seed)
    unchecked = build_site_data(fed, fed.site("A"), 0, splits["A"], cfg.data, originals=False)
    assert dotted not in unchecked.train.ids  # the prepared label alone: the scribble is gone
    checked = check_folder(out, cfg.data.split, cfg.data.seed)
    declared = split_sizes(checked.site("A"), make_splits(checked, cfg.data.split, cfg.data.seed)["A"])["train"]
    assert declared == len(_train_ids(out, "A"))  # the check: every training case has an annotated voxel
    _, data = node.site_data(node.NodeSettings("A", out, tmp_path / "samples"), cfg, 0)
    assert len(data.train) == declared and data.unannotated_train == 0
