"""``fedseg predict --tta`` (mirroring test-time augmentation, ``fedseg.evaluate.mirror``) and ``--device``.

Mirroring makes a prediction equivariant under every flip of the spatial axes (the average runs over the group of
flips), which a plain network is not: the tests check that property on MONAI networks in 2D and 3D, on the whole-
image path and on the sliding-window path of ``fedseg predict``, and the logits against the average computed here
by hand. A routing bundle (FedSM) routes on the image as given.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data.federation import Federation, Regions
from fedseg.engine.messages import weights_of
from fedseg.evaluate.mirror import MirrorAveraged, mirror_axes
from fedseg.models.factory import build_segmenter
from fedseg.predict import predict
from fedseg.run.outputs import write_bundle_files

ORGAN = Regions.from_mapping({"organ": [1]})


def test_mirror_axes_are_every_subset_of_the_spatial_axes_the_image_as_given_first():
    assert mirror_axes(2) == [(), (2,), (3,), (2, 3)]
    three = mirror_axes(3)
    assert three[0] == () and len(three) == 8 and len(set(three)) == 8
    assert {a for subset in three for a in subset} == {2, 3, 4}


@pytest.mark.parametrize("dims", [2, 3])
def test_mirrored_logits_are_the_mean_over_flips_and_equivariant_under_each_flip(tiny_config, dims):
    network = build_segmenter(tiny_config().model, dims, 2, 1, seed=0).eval()
    mirrored = MirrorAveraged(network, dims)
    x = torch.randn((2, 2) + (16,) * dims, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        by_hand = torch.stack([network(x)] + [network(x.flip(a)).flip(a) for a in mirror_axes(dims)[1:]]).mean(0)
        got = mirrored(x)
        torch.testing.assert_close(got, by_hand, rtol=1e-5, atol=1e-5)
        for axes in mirror_axes(dims)[1:]:
            torch.testing.assert_close(mirrored(x.flip(axes)), got.flip(axes), rtol=1e-5, atol=1e-5)
        plain_error = (network(x.flip(2)) - network(x).flip(2)).abs().max()
    assert plain_error > 1e-3  # the plain network is not equivariant: the property above is the mirroring's


def volume_bundle(folder: Path, tiny_config) -> Path:
    """An untrained 3D ``global`` bundle that predicts by sliding window (16^3 patches, one window per 16^3 image)."""
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16, "volume": {"patch_size": 16}})
    network = build_segmenter(cfg.model, 3, 1, 1, seed=3)
    write_bundle_files(folder, {"global": weights_of(network)}, cfg, Federation("ct", "3d", 1, ORGAN, []))
    return folder


def test_tta_on_the_sliding_window_path_gives_flip_equivariant_masks_and_is_recorded(tmp_path, tiny_config):
    bundle = volume_bundle(tmp_path / "fedavg", tiny_config)
    image = np.random.default_rng(0).normal(size=(16, 16, 16)).astype(np.float32)
    image[4:12, 3:9, 5:14] += 2.0  # something off-centre for the network to respond to
    affine = np.diag([1.0, 1.0, 2.0, 1.0])
    for name, flipped in [("given", image), ("flipped", image[::-1, :, ::-1])]:
        (tmp_path / name).mkdir()
        nib.save(nib.Nifti1Image(np.ascontiguousarray(flipped), affine), tmp_path / name / "case.nii.gz")

    def mask(name: str, tta: bool) -> np.ndarray:
        out = tmp_path / f"{name}-{tta}"
        predict(bundle, tmp_path / name, out, tta=tta)
        return np.asarray(nib.load(out / "case.nii.gz").dataobj)

    given, flipped = mask("given", True), mask("flipped", True)
    assert 0 < given.sum() < given.size  # the mask is no trivial all or nothing
    np.testing.assert_array_equal(flipped, given[::-1, :, ::-1])
    plain_given, plain_flipped = mask("given", False), mask("flipped", False)
    assert (plain_flipped != plain_given[::-1, :, ::-1]).any()  # without mirroring the property fails
    assert (given != plain_given).any()
    record = json.loads((tmp_path / "given-True" / "predict.json").read_text())
    assert (record["tta"], record["device"]) == (True, "cpu")
    assert json.loads((tmp_path / "given-False" / "predict.json").read_text())["tta"] is False


def test_an_unusable_device_is_one_line_naming_it_and_nothing_is_written(tmp_path, tiny_config):
    bundle = volume_bundle(tmp_path / "fedavg", tiny_config)
    (tmp_path / "in").mkdir()
    nib.save(nib.Nifti1Image(np.zeros((16, 16, 16), np.float32), np.eye(4)), tmp_path / "in" / "case.nii.gz")
    said = CliRunner().invoke(
        app,
        ["predict", "--model", str(bundle), "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out")]
        + ["--device", "cuda:99", "--tta"],
    )
    assert said.exit_code == 1 and "device 'cuda:99'" in said.output, said.output
    assert len(said.output.strip().splitlines()) == 1 and "Traceback" not in said.output
    assert not (tmp_path / "out").exists()
