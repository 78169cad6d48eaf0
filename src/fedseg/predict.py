"""``fedseg predict``: apply a run's trained bundle (``RUN/model/<algorithm>/``) to new image files.

Pipeline, per image file (PNG/JPEG/NPY/NIfTI/NRRD/MetaImage) or DICOM series folder (read by
``fedseg.data.case_files.read_image``), or per nnU-Net case: the ``<case>_XXXX.<ext>`` channel files of a folder such
as a dataset's ``imagesTs/`` are read one case at a time, stacked as ``fedseg data import nnunet`` stacks them, the
mask named ``<case>.<ext>`` (``nnunet_cases``; one channel file given alone brings its case):

1. preprocess exactly as training did (``fedseg.data.preprocess.case_tensors`` with the
   manifest's ``image_size`` and ``normalize``): ``x`` ``(C, *S)``, ``S = (image_size,) * dims``;
2. bundles that route each image among their networks (a family's ``routing``, e.g. FedSM's super model,
   ``fedseg.algorithms.fedsm.routing``: the selector picks a network per image, ``gamma`` overrides its
   threshold) apply that routing. Single-model bundles
   (``global``: FedAvg and relatives, centralized; ``local:<site>``: pick one with ``site``) apply
   that network. Masks = ``sigmoid(logits) > threshold`` (manifest ``threshold``), ``(R, *S)``,
   exactly as evaluation computes them (``fedseg.evaluate.inference.predict_masks``); with ``tta`` the network
   that segments an image (the routed one, chosen on the image as given) is mirrored: its logits averaged over
   every flip of the spatial axes (``fedseg.evaluate.mirror``, nnU-Net's test-time augmentation; evaluation does
   not do this);
3. resize the masks back to the file's spatial shape (nearest, ``preprocess.restore_size``) and
   turn them into a label map with the federation's label values (``Regions.to_label``);
   volume bundles (manifest ``volume.patch_size`` set, ``data.volume``): steps 1-3 are the volume
   pipeline instead, exactly as evaluation runs it: the file is preprocessed on its own grid
   (``fedseg.data.volumes.preprocess`` with its spacing, ``file_spacing``: the volume header's, else 1),
   predicted by sliding window and mapped back to its grid (``fedseg.evaluate.sliding.predict_on_grid``);
   a selector still routes on the fixed-size view of step 1 (ensemble mode: the super model slides);
4. write the label map in the input's format: PNG for PNG/JPEG (lossless; with the photograph's EXIF orientation,
   so that viewers turn it as they turn the photo: both are on its stored pixel grid), ``.npy``, NIfTI
   with the input's spatial header, NRRD (``.nrrd``) or MetaImage (``.mha``, one file, for a ``.mha`` or a ``.mhd``
   header) on the input's grid as ITK reads it (spacing, origin, directions in LPS:
   ``fedseg.data.volume_write``); DICOM series get a NIfTI mask on their grid; a 2D image stored ``(X, Y, 1)``, as
   NIfTI, NRRD or MetaImage, an ``(X, Y, 1)`` mask, the shape of its image; plus
   ``predictions.csv``: per image ``file``, ``mask``, ``model``
   (the routed bundle's chosen candidate, or the single model's name), ``round`` (the round that model was
   selected at on validation, as the bundle's model card says: ``fedseg.run.model_card.model_round``, a routing's
   ``round_key``; empty where it does not say, e.g. a bundle written before cards), ``confidence`` (empty without
   routing) and the routing's ``prob:<candidate>`` scores;
5. with ``overlay``: ``<name>_overlay.png`` per input, the image (3D: its middle slice) with the
   predicted regions filled and outlined in the Okabe-Ito colours (``overlay_image``);
6. with ``dicom_seg``: ``<name>.dcm`` per DICOM series input, a DICOM-SEG of the region masks of step 3 (before they
   are painted to a label map) referencing the source slices (``fedseg.predict_seg``; other inputs get none, and
   ``predictions.csv`` gains a ``dicom_seg`` column after ``mask``, empty for them).

Channel order: a bundle whose federation named its channels (manifest ``channel_names``) reads them in that order;
where the input belongs to an nnU-Net dataset whose ``dataset.json`` names them too (``check_dataset_channels``;
an MSD task's ``modality``), the same names in another order are refused (nothing is predicted; one line says both
orders); ``notes`` receives the order the model reads, and what the dataset.json says where its names are others
(``T1w`` for ``T1``: no order can be read from them), for the user to check.

Every input is listed and read and checked (readable, channel count, spatial dimensions, no NaN or Inf pixels)
before any model runs: an entry of the input folder that cannot be an input (another file type, a broken link, a
folder of DICOM files that is no series) is reported, never skipped. A DICOM series whose files cannot be read as
one volume (a missing slice, uneven spacing, a damaged slice: a PACS batch's one bad series) is skipped where the
other inputs can be predicted and have no other problem: one warning line naming its folder and what is wrong, the
series listed in ``predict.json`` (``skipped``), and ``fedseg predict`` lists them again at the end and exits 1;
where every input is such a series, nothing is predicted, as for any other problem. ``out`` must not be or lie
inside the input folder, and no folder may sit where an output file goes. Outputs go to a hidden staging folder inside
``out`` (``folder_write.staging_folder``) and are moved into place only when all of them are written, all together
(``folder_write.move_in``: files they replace, with ``--force``, are put back if a move fails or is interrupted), so a
failure or interruption while reading, predicting or writing leaves ``out`` as it was. ``--force`` replaces an earlier
predict in ``out`` as a whole: its masks, overlays and DICOM-SEGs that this one does not rewrite (those its
``predictions.csv`` lists, ``predict_outputs.earlier_outputs``) are removed in the same move, so every mask in ``out``
is one that ``predictions.csv`` and ``predict.json`` describe. ``predict.json`` records the options and, for a
bundle routing by a threshold, ``gamma_used``: the γ that routed the images (``--gamma``, else the bundle's).
Errors are ``PredictError``
(or ``FederationError`` from the readers, ``OSError`` from the file system), each naming the file; the same problem
on many files is grouped (``folder.group_problems``).

This module holds the command (``predict``) and the loop that writes the predictions (``write_predictions``); the
model is found and built by ``fedseg.predict_model``, the inputs listed and read by ``fedseg.predict_inputs``
(nnU-Net cases and channel names: ``fedseg.predict_nnunet``), the outputs named, checked and written by
``fedseg.predict_outputs`` (DICOM-SEGs: ``fedseg.predict_seg``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from fedseg.atomic_files import strict_json_text
from fedseg.data.folder_write import move_in, staging_folder
from fedseg.data.preprocess import restore_size
from fedseg.evaluate.inference import predict_masks
from fedseg.evaluate.mirror import MirrorAveraged
from fedseg.evaluate.sliding import network_for, predict_on_grid
from fedseg.predict_inputs import Input, Skipped, overlay_name, read_inputs, read_source
from fedseg.predict_model import Predictor, build_predictor, find_model
from fedseg.predict_nnunet import Source
from fedseg.predict_outputs import (
    CSV_NAME,
    check_out,
    earlier_outputs,
    output_names,
    overlay_image,
    write_mask,
    write_picture,
)
from fedseg.predict_seg import SegWriter, seg_writer
from fedseg.run.bundles import Bundle, load_bundle
from fedseg.run.model_card import RECORD_NAME, card_line, prediction_record
from fedseg.run.outputs import csv_text
from fedseg.run.preflight import check_device
from fedseg.wording import listed

log = logging.getLogger("fedseg.predict")


def predict(
    model: Path,
    input: Path,
    out: Path,
    gamma: float | None = None,
    algorithm: str | None = None,
    site: str | None = None,
    force: bool = False,
    batch_size: int = 8,
    overlay: bool = False,
    notes: list[str] | None = None,
    dicom_seg: bool = False,
    device: str = "cpu",
    tta: bool = False,
    skipped: list[Skipped] | None = None,
) -> list[dict]:
    """Predict a mask for every image of ``input`` (a file or a folder) into ``out``; returns the
    rows of ``predictions.csv``. Nothing is written unless every input is valid (but for the skipped series,
    below). ``overlay``: also ``<name>_overlay.png`` per input, the image with its predicted regions drawn on it
    (``overlay_image``).
    ``dicom_seg``: also ``<name>.dcm`` per DICOM series input, its regions as a DICOM-SEG (``fedseg.predict_seg``);
    refused where no input is a DICOM series (or where every DICOM series input was skipped, below: it says so).
    ``predict.json`` records the bundle (its weights' SHA-256 and model card) and the options. ``notes``, when
    given, receives lines for the user: what the model is (its card, where it has one: ``card_line``), the channel
    order it reads, where it knows it (``channels_note``). ``device``: where the networks run (``cpu``,
    ``cuda[:N]``, ``mps``; float32, sliding-window blending on the CPU); ``tta``: mirroring test-time augmentation
    (``fedseg.evaluate.mirror``; 4 passes per 2D image, 8 per 3D window).

    A DICOM series input whose files cannot be read as one volume (a missing slice, uneven spacing, a damaged
    slice: ``dicom_series.SeriesError``) is skipped where other inputs can be predicted: one WARNING line each (logger
    ``fedseg.predict``) naming its folder and what is wrong, listed in ``predict.json`` (``skipped``: its ``input``
    and ``problem``) and added to ``skipped`` when given (``fedseg predict`` then exits non-zero); where every input
    is such a series, or another input has another problem, nothing is predicted (``read_inputs``)."""
    run_on = check_device(device, "--device cpu")
    bundle = load_bundle(find_model(model, algorithm))
    predictor = build_predictor(bundle, gamma, site)
    predictor.model.to(run_on)
    if notes is not None and (line := card_line(bundle.manifest.get("trained"), site)) is not None:
        notes.append(line)
    left_out: list[Skipped] = []
    inputs = read_inputs(input, bundle, overlay, notes, left_out)
    for series in left_out:
        log.warning(series.line)
    # before any prediction; the series skipped: where they were all the series, the refusal says so
    seg = seg_writer(bundle, [i.path for i in inputs], Path(input), len(left_out)) if dicom_seg else None
    out = Path(out)
    check_out(out, inputs, force, overlay, Path(input), dicom_seg, bundle.folder)
    names = output_names(inputs, overlay, dicom_seg)
    replaced = [t for t in (out / n for n in names) if t.exists() or t.is_symlink()]
    masks = [i.mask_name for i in inputs]
    stale = earlier_outputs(out, names, masks) if force and replaced else []  # the earlier predict's other outputs
    if stale and notes is not None:
        shown = listed((p.name for p in stale), 3)
        notes.append(f"--force: removed {len(stale)} file(s) of the earlier predict in {out} ({shown})")
    with staging_folder(out, "predict") as staging:  # removed, and out if it made it, on any error or interruption
        rows = write_predictions(predictor, bundle, inputs, staging, batch_size, overlay, seg, run_on, tta)
        options = {"algorithm": bundle.folder.name, "threshold": bundle.manifest["threshold"], "gamma": gamma}
        options |= {"gamma_used": routing_gamma(predictor), "tta": tta, "device": str(run_on)}
        record = prediction_record(bundle.folder, bundle.manifest, {**options, "site": site}, len(inputs))
        record["skipped"] = [{"input": series.name, "problem": series.problem} for series in left_out]
        (staging / RECORD_NAME).write_text(strict_json_text(record, indent=2) + "\n", encoding="utf-8")
        move_in(staging, out, replaced + stale)  # all together: a failed or interrupted move puts back what it moved
    if skipped is not None:
        skipped += left_out
    return rows


def routing_gamma(predictor: Predictor) -> float | None:
    """The threshold γ that routed every image (FedSM: ``--gamma``, else the one stored in the bundle, chosen on
    validation), for ``predict.json``; None for a bundle that does not route by a threshold."""
    network = predictor.model
    if predictor.routed is None or getattr(network, "mode", None) != "threshold":
        return None
    return float(network.gamma)  # type: ignore[arg-type]  # SuperModel.gamma: a float


def write_predictions(
    predictor: Predictor,
    bundle: Bundle,
    inputs: list[Input],
    folder: Path,
    batch_size: int,
    overlay: bool = False,
    seg: SegWriter | None = None,
    device: torch.device = torch.device("cpu"),
    tta: bool = False,
) -> list[dict]:
    """Masks of every input and ``predictions.csv`` into ``folder`` (with ``seg``: the DICOM-SEG of each DICOM
    series input too, its name in the ``dicom_seg`` column); returns the CSV rows. The networks run on ``device``
    (where ``predictor.model`` is), mirrored with ``tta`` (:class:`fedseg.evaluate.mirror.MirrorAveraged`)."""
    regions, threshold = bundle.regions, float(bundle.manifest["threshold"])
    model = MirrorAveraged(predictor.model, bundle.manifest["spatial_dims"]) if tta else predictor.model
    rows = []
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        x = torch.stack([i.x for i in batch])
        masks = [None] * len(batch) if bundle.volume else predict_masks(model, x, batch_size, threshold, device)
        for item, mask, choice in zip(batch, masks, predictor.choices(x.to(device))):
            if item.volume is not None and bundle.volume is not None:  # sliding window, on the file's own grid
                image, grid = item.volume
                network = network_for(model, item.x, device)  # a selector routes on the fixed-size view
                restored = predict_on_grid(network, image, grid, bundle.volume, threshold, device).numpy()
            else:
                fit = bundle.manifest.get("resize", "stretch")  # as the run placed its images (data.resize)
                restored = restore_size(mask, item.spatial, fit).numpy()
            label = item.stored_order(regions.to_label(restored))  # turned back where it was turned
            write_mask(folder / item.mask_name, label, item.path)
            if overlay or seg is not None:  # the label map's regions: what the run scored (eval.score_on)
                painted = regions.one_hot(label)
            if overlay:
                picture = overlay_image(read_source(Source(item.files), bundle.kind), painted)
                write_picture(folder / overlay_name(item.mask_name), picture, item.path)  # a photo's EXIF turn
            row = {"file": item.name, "mask": item.mask_name, **choice}
            if seg is not None:  # a DICOM series' SEG (named), none for other inputs ("")
                row["dicom_seg"] = seg.write_for(folder, painted, item.path, choice["model"])
            rows.append(row)
    columns = list(predictor.columns)
    if seg is not None:  # the SEG's column right after the mask's
        columns.insert(columns.index("mask") + 1, "dicom_seg")
    (folder / CSV_NAME).write_text(csv_text(columns, rows), encoding="utf-8")
    return rows
