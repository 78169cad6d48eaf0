"""DICOM series' Modality when federation.yaml has no channel_names: CT normalized otherwise than in Hounsfield
windows, and sites whose series are of different modalities, are said once when a run starts (a fresh-eyes DICOM
study trained CT Hounsfield units with z-scoring, and CT next to MR, without a word)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.run.checks import data_notes, dicom_modalities

pydicom = pytest.importorskip("pydicom")


def _header(path: Path, modality: str) -> None:
    """A DICOM file with a Modality (the header is all dicom_modalities reads)."""
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta, ds.Modality, ds.SOPClassUID = meta, modality, CTImageStorage
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def _federation(tmp_path: Path, modalities: dict[str, str | None]) -> Federation:
    def loader():
        return np.zeros((1, 2, 2, 2)), np.zeros((2, 2, 2))

    sites = []
    for site, modality in modalities.items():
        image = tmp_path / site / "images" / "c1"
        if modality is None:  # a NIfTI site
            image = image.with_suffix(".nii.gz")
        else:
            for k in (2, 1):  # slices without an extension, as many PACS exports name them
                _header(image / (f"IM{k:04d}" if site == "hospB" else f"s{k}.dcm"), modality)
            (image / ".DS_Store").write_bytes(b"\0")
        sites.append(Site(site, [Case("c1", loader, meta={"image": str(image), "label": "x"})]))
    return Federation("f", "3d", 1, Regions(("organ",), ((1,),)), sites)


def test_the_modality_of_each_sites_first_series_is_read(tmp_path):
    fed = _federation(tmp_path, {"hospA": "CT", "hospB": "MR", "hospC": None})
    assert dicom_modalities(fed) == {"hospA": "CT", "hospB": "MR"}


def test_ct_series_and_mixed_modalities_are_said_at_the_start(tiny_config):
    folder = {"source": "folder", "root": "/data/fed"}
    ct, mixed = {"hospA": "CT", "hospC": "CT"}, {"hospA": "CT", "hospB": "MR", "hospC": "CT"}
    (line,) = data_notes(tiny_config(data=folder), "2d", None, ct)
    assert line.startswith("note: the images are CT (DICOM Modality at 'hospA', 'hospC') but data.normalize is minmax")
    notes = data_notes(tiny_config(data=folder), "2d", None, mixed)
    assert notes[1] == (
        "note: the sites' DICOM series are of different modalities (CT: 'hospA', 'hospC'; MR: 'hospB'): one network "
        "learns intensities that mean different things at different sites; check that each site's images are the "
        "sequence you meant (channel_names in federation.yaml says it)"
    )
    windows = {**folder, "normalize": "ct", "ct_windows": [[-200, 300, 50, 100]]}
    assert data_notes(tiny_config(data=windows), "2d", None, ct) == []
    assert data_notes(tiny_config(data=folder), "2d", ["T1"], ct) == []  # channel_names say what the images hold
    assert data_notes(tiny_config(data=folder), "2d", None, {"hospB": "MR"}) == []
