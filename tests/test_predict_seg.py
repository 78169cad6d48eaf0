"""``fedseg predict --dicom-seg``: a DICOM series input's regions also as a DICOM-SEG referencing the series.

The series is written with pydicom (``test_readers.write_series``: anisotropic spacing, x and y swapped, slices
towards the feet, files in shuffled name order); the bundle is an untrained network written by the run's own
``write_bundle_files``, its last layer set so that its region masks are disjoint (organ / lesion) or nested
(WT / TC / ET) by construction. The SEG is read back with fedseg's own DICOM-SEG reader and with highdicom.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data import dicom_seg, readers
from fedseg.data.federation import Federation, Regions
from fedseg.data.folder import load_folder
from fedseg.engine.messages import weights_of
from fedseg.models.factory import build_segmenter
from fedseg.predict import predict
from fedseg.predict_model import PredictError
from fedseg.run.outputs import write_bundle_files

pydicom = pytest.importorskip("pydicom")
hd = pytest.importorskip("highdicom")
pytest.importorskip("itk")
from test_readers import VALUES, write_series  # noqa: E402  (after the importorskips it needs)

DISJOINT = Regions.from_mapping({"organ": [1], "lesion": [2]})
NESTED = Regions.from_mapping({"whole tumor": [1, 2, 3], "tumor core": [2, 3], "enhancing tumor": [3]})


def bundle_of(
    folder: Path, regions: Regions, tiny_config, kind: str = "3d", signs=(), offsets=(), channels: int = 1
) -> Path:
    """A ``global`` bundle (``RUN/model/fedavg/``, untrained) whose region ``k`` logits are ``signs[k]`` times
    region 0's minus ``offsets[k]`` (its last layer is linear): ``-1`` gives a region disjoint from region 0,
    ``+1`` with a growing offset nested regions."""
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16})
    network = build_segmenter(cfg.model, 3 if kind == "3d" else 2, channels, len(regions), seed=0)
    weights = weights_of(network)
    weight, bias = list(weights)[-2:]  # the last (transposed) convolution: weight (in, out, *kernel)
    for k, (sign, offset) in enumerate(zip(signs, offsets), start=1):
        weights[weight][:, k] = sign * weights[weight][:, 0]
        weights[bias][k] = sign * weights[bias][0] - offset
    write_bundle_files(folder, {"global": weights}, cfg, Federation("ct", kind, channels, regions, []))
    return folder


def test_a_series_given_to_a_model_of_several_channels_is_refused_with_the_way_to_give_them(tmp_path, tiny_config):
    """A DICOM series is one channel: the refusal says how a T1 + FLAIR model's cases can reach predict."""
    two = bundle_of(tmp_path / "two" / "fedavg", DISJOINT, tiny_config, channels=2)
    write_series(tmp_path / "in" / "case", VALUES)
    with pytest.raises(PredictError, match="image has 1 channels but the model expects 2") as refused:
        predict(two, tmp_path / "in" / "case", tmp_path / "out")
    assert "a DICOM series is one channel" in str(refused.value) and "imagesTs" in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def disjoint(tmp_path_factory, tiny_config) -> Path:
    return bundle_of(tmp_path_factory.mktemp("disjoint") / "fedavg", DISJOINT, tiny_config, signs=[-1], offsets=[0.02])


def series_input(folder: Path) -> Path:
    """``folder/case/``: a DICOM series (and ``folder/plain.nii.gz``: the same voxels as a NIfTI, no series)."""
    write_series(folder / "case", VALUES)
    nib.save(nib.Nifti1Image(VALUES, readers.volume_grid(folder / "case").affine), folder / "plain.nii.gz")
    return folder


def test_the_seg_of_a_series_reads_back_as_the_nifti_mask_and_references_the_series(disjoint, tmp_path):
    inputs, out = series_input(tmp_path / "in"), tmp_path / "out"
    rows = predict(disjoint, inputs, out, dicom_seg=True)
    # the series gets its .dcm, the NIfTI input none; predictions.csv names it
    assert sorted(p.name for p in out.iterdir()) == [
        "case.dcm",
        "case.nii.gz",
        "plain.nii.gz",
        "predict.json",
        "predictions.csv",
    ]
    with open(out / "predictions.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["file", "mask", "dicom_seg", "model", "round", "confidence"]
    assert {r["round"] for r in table} == {""}  # a bundle written without a model card: no round to tell
    assert [(r["file"], r["dicom_seg"]) for r in table] == [("case", "case.dcm"), ("plain.nii.gz", "")]
    assert [r["dicom_seg"] for r in rows] == ["case.dcm", ""]

    series = inputs / "case"
    mask = np.asarray(nib.load(out / "case.nii.gz").dataobj)
    assert set(np.unique(mask)) == {0, 1, 2}  # both regions predicted somewhere, background too
    seg = dicom_seg.read_dicom_seg(
        out / "case.dcm", readers.volume_grid(series), series, label_names={1: "organ", 2: "lesion"}
    )
    np.testing.assert_array_equal(seg, mask)
    by_regions = dicom_seg.read_dicom_seg(out / "case.dcm", readers.volume_grid(series), series, regions=DISJOINT)
    np.testing.assert_array_equal(by_regions, mask)  # named as the regions: the same label map

    ds, source = pydicom.dcmread(out / "case.dcm"), pydicom.dcmread(next(series.iterdir()), stop_before_pixels=True)
    assert ds.Modality == "SEG" and ds.SegmentationType == "BINARY"
    assert [(s.SegmentNumber, s.SegmentLabel) for s in ds.SegmentSequence] == [(1, "organ"), (2, "lesion")]
    assert ds.SegmentSequence[0].SegmentAlgorithmType == "AUTOMATIC"
    assert ds.SegmentSequence[0].SegmentationAlgorithmIdentificationSequence[0].AlgorithmName == "fedseg fedavg"
    assert ds.StudyInstanceUID == source.StudyInstanceUID and ds.FrameOfReferenceUID == source.FrameOfReferenceUID
    assert (ds.PatientName, ds.PatientID) == (source.PatientName, source.PatientID)
    assert ds.SeriesInstanceUID != source.SeriesInstanceUID
    assert ds.ReferencedSeriesSequence[0].SeriesInstanceUID == source.SeriesInstanceUID
    referenced = {i.ReferencedSOPInstanceUID for i in ds.ReferencedSeriesSequence[0].ReferencedInstanceSequence}
    assert referenced == {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in series.iterdir()}
    assert "fedseg" in ds.SeriesDescription and "fedavg" in ds.SeriesDescription
    assert ds.Manufacturer == "fedseg" and str(ds.ContentCreatorName) == "fedseg"

    said = CliRunner().invoke(
        app,
        ["predict", "--model", str(disjoint), "--input", str(inputs), "--out", str(tmp_path / "cli"), "--dicom-seg"],
    )
    assert (
        said.exit_code == 0 and "2 mask(s), 1 DICOM-SEG(s), predictions.csv and predict.json written" in said.output
    ), said.output
    predict(disjoint, inputs, tmp_path / "plain-out")  # without dicom_seg: no .dcm, the columns as before
    assert not list((tmp_path / "plain-out").glob("*.dcm"))
    assert (tmp_path / "plain-out" / "predictions.csv").read_text().startswith("file,mask,model,round,confidence\n")


def test_nested_regions_are_overlapping_segments_each_its_regions_mask(tmp_path, tiny_config):
    """WT ⊇ TC ⊇ ET: each segment holds its region's whole mask (a TC voxel is in the WT segment too), which the
    label map painted smallest region last; read per segment with highdicom."""
    bundle = bundle_of(tmp_path / "fedavg", NESTED, tiny_config, signs=[1, 1], offsets=[0.02, 0.04])
    series = tmp_path / "in" / "case"
    slices = write_series(series, VALUES)  # in slice order (the series' third array axis)
    predict(bundle, series, tmp_path / "out", dicom_seg=True)
    label = np.asarray(nib.load(tmp_path / "out" / "case.nii.gz").dataobj)
    expected = NESTED.one_hot(label)  # nested masks: the label map holds them exactly
    assert all(m.any() for m in expected) and (expected[0] & expected[1]).any()  # the segments overlap

    seg = hd.seg.segread(tmp_path / "out" / "case.dcm")
    assert [str(s.SegmentLabel) for s in seg.SegmentSequence] == list(NESTED.names)
    pixels = seg.get_pixels_by_source_instance(
        source_sop_instance_uids=[ds.SOPInstanceUID for ds in slices], combine_segments=False
    )  # (slices, rows, columns, segments)
    np.testing.assert_array_equal(pixels.transpose(3, 2, 1, 0), expected)
    grid, seg_file = readers.volume_grid(series), tmp_path / "out" / "case.dcm"
    # read back as a federation label: the segments name its regions, so they are painted as the prediction was
    np.testing.assert_array_equal(dicom_seg.read_dicom_seg(seg_file, grid, series, regions=NESTED), label)
    labels = {1: "whole tumor", 2: "tumor core", 3: "enhancing tumor"}  # named as labels too: they overlap all the same
    np.testing.assert_array_equal(dicom_seg.read_dicom_seg(seg_file, grid, series, labels, NESTED), label)
    with pytest.raises(ValueError, match="segments overlap .* names one of the federation's regions"):
        dicom_seg.read_dicom_seg(seg_file, grid, series)  # without the regions no label map holds them
    # ... and as a folder federation's label: data check passes it, the case loader reads the same label map
    root = tmp_path / "fed"
    for case in ("c1", "c2", "c3"):
        shutil.copytree(series, root / "site1" / "images" / case)
        (root / "site1" / "labels").mkdir(parents=True, exist_ok=True)
        shutil.copy(seg_file, root / "site1" / "labels" / f"{case}.dcm")
    header = {"name": "brats-like", "kind": "3d", "channels": 1, "regions": NESTED.as_dict()}
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    checked = CliRunner().invoke(app, ["data", "check", str(root)])
    assert checked.exit_code == 0 and "Traceback" not in checked.output, checked.output
    np.testing.assert_array_equal(load_folder(root).sites[0].cases[0].arrays()[1], label)
    other = Regions.from_mapping({"WT": [1, 2, 3], "TC": [2, 3], "ET": [3]})  # names the segments do not use
    with pytest.raises(ValueError, match=r"segments overlap .*regions \(WT, TC, ET\)"):
        dicom_seg.read_dicom_seg(seg_file, grid, series, regions=other)


def test_dicom_seg_without_a_dicom_series_input_is_refused_in_one_line(tmp_path, tiny_config):
    bundle = bundle_of(tmp_path / "fedavg", DISJOINT, tiny_config, kind="2d")
    (tmp_path / "in").mkdir()
    Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16)).save(tmp_path / "in" / "a.png")
    args = ["predict", "--model", str(bundle), "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*args, "--dicom-seg"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert " ".join(result.output.split()) == (
        f"error: {tmp_path / 'in'}: --dicom-seg writes a DICOM-SEG for each DICOM series input (a folder of .dcm "
        "slices), and there is none among the inputs; leave out --dicom-seg for other images"
    )
    assert not (tmp_path / "out").exists()  # nothing predicted
    assert CliRunner().invoke(app, args).exit_code == 0  # without it: the PNG mask


def test_dicom_seg_without_highdicom_says_which_extra_to_install_before_predicting(disjoint, tmp_path, monkeypatch):
    import importlib

    import_module = importlib.import_module

    def without_highdicom(name, *args):
        if name == "highdicom":
            raise ImportError(name)
        return import_module(name, *args)

    write_series(tmp_path / "in" / "case", VALUES)
    monkeypatch.setattr(importlib, "import_module", without_highdicom)
    with pytest.raises(PredictError) as error:
        predict(disjoint, tmp_path / "in", tmp_path / "out", dicom_seg=True)
    assert str(error.value) == f"{tmp_path / 'in'}: writing a DICOM-SEG needs highdicom: pip install 'fedseg[formats]'"
    assert not (tmp_path / "out").exists()


def test_an_existing_seg_is_refused_without_force_replaced_with_it_and_put_back_on_failure(
    disjoint, tmp_path, monkeypatch
):
    series, out = tmp_path / "in" / "case", tmp_path / "out"
    write_series(series, VALUES)
    predict(disjoint, series, out, dicom_seg=True)
    first = pydicom.dcmread(out / "case.dcm").SOPInstanceUID
    (out / "case.nii.gz").unlink()
    (out / "predictions.csv").unlink()
    (out / "predict.json").unlink()
    with pytest.raises(PredictError, match=f"{out / 'case.dcm'}: exists .*overwrite with --force"):
        predict(disjoint, series, out, dicom_seg=True)
    assert sorted(p.name for p in out.iterdir()) == ["case.dcm"]
    predict(disjoint, series, out, dicom_seg=True, force=True)
    assert pydicom.dcmread(out / "case.dcm").SOPInstanceUID != first  # a new SEG

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rename = Path.rename

    def full_disk_after_the_seg(self, target):  # the staged files move in by name: case.dcm first, the CSV near the end
        if self.parent.name.startswith(".predict-") and Path(target).parent == out and self.name == "predictions.csv":
            raise OSError(28, "No space left on device", str(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", full_disk_after_the_seg)
    with pytest.raises(OSError, match="No space left"):
        predict(disjoint, series, out, dicom_seg=True, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # all put back, no staging folder left
    monkeypatch.undo()

    (tmp_path / "other" / "case.dcm").mkdir(parents=True)  # a folder where the SEG goes: refused, even with --force
    with pytest.raises(PredictError, match="case.dcm: is a folder"):
        predict(disjoint, series, tmp_path / "other", dicom_seg=True, force=True)


def test_a_one_slice_series_given_to_a_2d_model_gets_a_mask_of_its_shape_and_a_seg(tmp_path, tiny_config):
    """A 2D model reads a one-slice series as an ``(X, Y)`` image; its mask keeps the series' ``(X, Y, 1)`` grid
    (shape and affine, as nnU-Net's 2D NIfTI), and the SEG still reads back as that mask."""
    bundle = bundle_of(tmp_path / "fedavg", DISJOINT, tiny_config, kind="2d", signs=[-1], offsets=[0.02])
    series = tmp_path / "in" / "case"
    write_series(series, VALUES[:, :, :1])
    predict(bundle, series, tmp_path / "out", dicom_seg=True)
    mask = nib.load(tmp_path / "out" / "case.nii.gz")
    grid = readers.volume_grid(series)
    assert mask.shape == grid.shape == (*VALUES.shape[:2], 1)
    np.testing.assert_allclose(mask.affine, grid.affine)
    seg = dicom_seg.read_dicom_seg(tmp_path / "out" / "case.dcm", grid, series, label_names={1: "organ", 2: "lesion"})
    np.testing.assert_array_equal(seg, np.asarray(mask.dataobj))


def test_a_one_channel_model_prints_no_channel_order_for_a_series(tmp_path, tiny_config):
    """A CT model (one channel, named) given a DICOM series: no channel-order note (one channel has no order to get
    wrong, and a series has no nnU-Net channel files); a two-channel model's note is the one predict prints."""
    from fedseg.predict_nnunet import channels_note
    from fedseg.run.bundles import load_bundle

    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16})
    network = build_segmenter(cfg.model, 3, 1, len(DISJOINT), seed=0)
    folder = tmp_path / "fedavg"
    write_bundle_files(
        folder, {"global": weights_of(network)}, cfg, Federation("ct", "3d", 1, DISJOINT, [], channel_names=["CT"])
    )
    write_series(tmp_path / "in" / "case", VALUES)
    notes: list[str] = []
    predict(folder, tmp_path / "in" / "case", tmp_path / "out", notes=notes)
    assert notes == [] and channels_note(load_bundle(folder), None) is None


def test_a_one_component_patient_name_is_copied_into_the_seg_without_highdicoms_warning(disjoint, tmp_path, recwarn):
    """A source series whose PatientName has one component (``ANON123``: valid DICOM, as anonymizers write it) gets
    its SEG with that name as it is, and without highdicom's 4-line warning on it (one per case, a flood over a test
    set)."""
    write_series(tmp_path / "in" / "case", VALUES, patient_name="ANON123")
    predict(disjoint, tmp_path / "in", tmp_path / "out", dicom_seg=True)
    assert str(pydicom.dcmread(tmp_path / "out" / "case.dcm").PatientName) == "ANON123"
    assert not [w for w in recwarn if "unlikely to represent the intended person name" in str(w.message)]


def test_an_anonymized_series_without_type2_patient_and_study_attributes_still_gets_its_seg(disjoint, tmp_path):
    """Anonymizers remove patient and study attributes DICOM makes type 2 (present, may be empty); highdicom needs
    them, so such a series got no SEG and, the outputs being written all together, no input got a mask. The SEG
    now carries them empty, the series' identity (study, frame of reference) as before; the files are not touched."""
    from fedseg.predict_seg import TYPE2_PATIENT_STUDY

    series = tmp_path / "in" / "anon"
    write_series(series, VALUES)
    for path in series.iterdir():
        ds = pydicom.dcmread(path)
        for keyword in TYPE2_PATIENT_STUDY:
            delattr(ds, keyword)
        ds.save_as(path)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    predict(disjoint, tmp_path / "in", tmp_path / "out", dicom_seg=True)
    seg = pydicom.dcmread(tmp_path / "out" / "anon.dcm")
    assert all(str(seg.get(keyword, "")) == "" for keyword in TYPE2_PATIENT_STUDY)
    source = pydicom.dcmread(next(series.iterdir()), stop_before_pixels=True)
    assert (seg.StudyInstanceUID, seg.FrameOfReferenceUID) == (source.StudyInstanceUID, source.FrameOfReferenceUID)
    labels = dicom_seg.read_dicom_seg(
        tmp_path / "out" / "anon.dcm", readers.volume_grid(series), series, regions=DISJOINT
    )
    np.testing.assert_array_equal(labels, np.asarray(nib.load(tmp_path / "out" / "anon.nii.gz").dataobj))
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_one_slice_of_a_pacs_export_named_without_dcm_is_told_to_be_given_as_its_series_folder(disjoint, tmp_path):
    """PACS exports name slices ``IM000123`` or by UID, without ``.dcm``: one such slice given as --input (a fresh-eyes
    run) was only "unsupported file type", the hint to give the series' folder kept for ``.dcm`` names."""
    write_series(tmp_path / "export" / "series", VALUES)
    for k, slice_file in enumerate(sorted((tmp_path / "export" / "series").iterdir())):
        slice_file.rename(slice_file.with_name(f"IM{k:06d}"))
    one = tmp_path / "export" / "series" / "IM000000"
    with pytest.raises(PredictError) as refused:
        predict(disjoint, one, tmp_path / "out")
    assert str(refused.value) == (
        f"{one}: unsupported file type (expected one of nii.gz, nii, png, jpg, jpeg, npy, nrrd, mha, mhd); "
        "a DICOM image is given as its series' folder"
    )
    assert not (tmp_path / "out").exists()
    predict(disjoint, one.parent, tmp_path / "out")  # its folder is the series
    assert (tmp_path / "out" / "series.nii.gz").is_file()


def series_with_a_gap(folder: Path) -> Path:
    """A DICOM series of ``VALUES`` with its third slice's file removed (a PACS export that lost one)."""
    write_series(folder, VALUES)
    lost = next(p for p in folder.iterdir() if int(pydicom.dcmread(p, stop_before_pixels=True).InstanceNumber) == 3)
    lost.unlink()
    return folder


def test_a_series_with_a_missing_slice_is_skipped_and_the_other_series_predicted(disjoint, tmp_path, caplog):
    """A PACS folder of three series, one missing a slice: the two good ones are predicted, the bad one is named in
    one warning line (its folder and what is wrong), listed in predict.json and again at the end, and the command
    exits 1 so that a script notices. Given alone (every input bad), it is refused as before: nothing written."""
    inputs, out = tmp_path / "pacs", tmp_path / "out"
    write_series(inputs / "ct1", VALUES)
    gap = series_with_a_gap(inputs / "ct2")
    write_series(inputs / "ct3", VALUES[::-1].copy())
    with caplog.at_level(logging.WARNING, logger="fedseg.predict"):
        said = CliRunner().invoke(app, ["predict", "--model", str(disjoint), "--input", str(inputs), "--out", str(out)])
    assert said.exit_code == 1 and "Traceback" not in said.output, said.output
    problem = [r.getMessage() for r in caplog.records if r.name == "fedseg.predict"]
    assert len(problem) == 1 and re.fullmatch(
        rf"{re.escape(str(gap))}: uneven slice spacing \(2\.5 to 5 mm; the largest gap is between IM\d+ and IM\d+\): "
        r"missing slices\? \(series skipped, not predicted\)",
        problem[0],
    ), problem
    text = " ".join(said.output.split())
    assert "2 mask(s), predictions.csv and predict.json written to" in text
    assert text.endswith(
        "error: 1 of 3 inputs skipped, not predicted (DICOM series that cannot be read as one volume; each said "
        f"above, listed in predict.json's skipped): {gap}"
    )
    assert sorted(p.name for p in out.iterdir()) == ["ct1.nii.gz", "ct3.nii.gz", "predict.json", "predictions.csv"]
    with open(out / "predictions.csv", newline="") as f:
        assert [row["file"] for row in csv.DictReader(f)] == ["ct1", "ct3"]
    record = json.loads((out / "predict.json").read_text())
    assert record["inputs"] == 2
    assert record["skipped"] == [
        {"input": "ct2", "problem": problem[0].removesuffix(" (series skipped, not predicted)")}
    ]
    good = readers.read_volume(out / "ct1.nii.gz")
    assert good.shape == VALUES.shape

    kept: list = []  # the API: the same, the skipped series handed back
    rows = predict(disjoint, inputs, tmp_path / "api", skipped=kept)
    assert [r["file"] for r in rows] == ["ct1", "ct3"] and [(s.path, s.name) for s in kept] == [(gap, "ct2")]

    alone = CliRunner().invoke(
        app, ["predict", "--model", str(disjoint), "--input", str(gap), "--out", str(tmp_path / "o")]
    )
    assert alone.exit_code == 1 and "Traceback" not in alone.output
    assert re.fullmatch(
        rf"error: {re.escape(str(gap))}: uneven slice spacing .* missing slices\?", " ".join(alone.output.split())
    )
    assert not (tmp_path / "o").exists()
    (tmp_path / "only").mkdir()
    shutil.move(gap, tmp_path / "only" / "ct2")
    with pytest.raises(PredictError, match=r"ct2: uneven slice spacing"):  # a folder of bad series only: refused
        predict(disjoint, tmp_path / "only", tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_bad_series_beside_an_input_of_another_problem_is_refused_with_it(tmp_path, tiny_config):
    """Only series unreadable as volumes are skipped: beside an input with another problem (a 2D PNG for a 3D
    model), the whole batch is refused as before, each problem one line, nothing written."""
    bundle = bundle_of(tmp_path / "fedavg", DISJOINT, tiny_config)
    inputs = tmp_path / "pacs"
    write_series(inputs / "ct1", VALUES)
    gap = series_with_a_gap(inputs / "ct2")
    Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16)).save(inputs / "photo.png")
    with pytest.raises(PredictError) as refused:
        predict(bundle, inputs, tmp_path / "out", skipped=[])
    lines = str(refused.value).splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"{gap}: uneven slice spacing") and "photo.png: a 2D PNG" in lines[1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", [1, 2])
def test_dicom_seg_where_every_series_was_skipped_says_so_in_one_line_and_writes_nothing(
    disjoint, tmp_path, caplog, bad
):
    """``--dicom-seg`` on inputs whose every DICOM series is skipped (unreadable as one volume) beside a NIfTI: refused
    in one line after the skip warnings, saying the series were all skipped (how many) and that it needs one readable
    series (it said there was no DICOM series among the inputs); nothing is predicted, an earlier predict's outputs in
    --out stay as they were. Without --dicom-seg the NIfTI is predicted, as the line says."""
    inputs, out = series_input(tmp_path / "in"), tmp_path / "out"
    shutil.rmtree(inputs / "case")  # the good series out: the NIfTI alone is readable
    gaps = [series_with_a_gap(inputs / f"ct{k}") for k in range(1, bad + 1)]
    predict(disjoint, inputs / "plain.nii.gz", out)  # an earlier predict's outputs, which a refusal leaves alone
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["predict", "--model", str(disjoint), "--input", str(inputs), "--out", str(out)]
    with caplog.at_level(logging.WARNING, logger="fedseg.predict"):
        said = CliRunner().invoke(app, [*args, "--dicom-seg", "--force"])
    assert said.exit_code == 1 and "Traceback" not in said.output, said.output
    warned = [r.getMessage() for r in caplog.records if r.name == "fedseg.predict"]
    assert len(warned) == bad and all(line.endswith("(series skipped, not predicted)") for line in warned), warned
    which = "the only DICOM series among the inputs was" if bad == 1 else "all 2 DICOM series among the inputs were"
    error = (
        f"error: {inputs}: --dicom-seg writes a DICOM-SEG for each DICOM series input, and {which} skipped "
        "(unreadable as one volume, said above); --dicom-seg needs at least one readable series: fix or remove the "
        "skipped series, or leave out --dicom-seg to predict the other inputs"
    )
    text = " ".join(said.output.split())
    assert text.endswith(error) and text.count("error:") == 1 and "none among the inputs" not in text, text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier  # nothing written (no staging), none removed
    fresh = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "new"), "--dicom-seg"])
    assert fresh.exit_code == 1 and " ".join(fresh.output.split()).endswith(error)
    assert not (tmp_path / "new").exists()  # an --out it would make: not made

    plain = CliRunner().invoke(app, [*args, "--force"])  # the other inputs predicted; the skipped ones said, exit 1
    assert plain.exit_code == 1 and "1 mask(s), predictions.csv and predict.json written" in plain.output
    assert f"{bad} of {bad + 1} inputs skipped" in " ".join(plain.output.split()) and all(
        str(g) in plain.output for g in gaps
    )
