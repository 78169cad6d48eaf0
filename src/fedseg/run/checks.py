"""Checks and notices of a run's algorithms made before any training: client sampling, the cost warnings and
the options' notes on this federation and network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.sampling import sampling_refusal
from fedseg.config import RunConfig
from fedseg.data.dataset import SiteData
from fedseg.data.dicom_series import dicom_modalities as dicom_modalities  # the run's CT note reads them
from fedseg.engine.context import Task

SIMULATOR_REFUSAL = (
    "fl.secure_aggregation = secagg+ runs only on Flower (`fedseg flower local|server`): in the simulator and the "
    "worker pool the coordinator holds every site's update in its own memory, so masking would protect nothing"
)

LOCAL_MODELS_WARN_SITES = 20  # above this many sites the K x K test evaluations of eval.local_models are announced


def check_sampling(cfg: RunConfig, num_sites: int, where: str) -> None:
    """Before any work: ``fl.clients_per_round`` fits the federation and every federated method of the run may
    sample (``fedseg.algorithms.sampling.sampling_refusal``); the baselines (centralized, local) do not sample."""
    from fedseg.engine.sampling import sample_count

    value = cfg.fl.clients_per_round
    k = sample_count(num_sites, value)
    if k == num_sites:
        return
    for name in cfg.algorithms:
        spec = get_algorithm(name)
        if not spec.federated:
            continue
        if (why := sampling_refusal(spec)) is not None:
            raise ValueError(
                f"fl.clients_per_round = {value}: {name} cannot train a sample of the sites per round: {why}. "
                f"Remove {name} from algorithms or unset fl.clients_per_round"
            )
        spec.check_sites(
            k, f"{where} sampled to {k} sites per round (fl.clients_per_round = {value})", cfg.methods.get(name)
        )


def cost_warnings(cfg: RunConfig, num_sites: int) -> list[str]:
    """Lines announcing what will make this run slow or unusual, shown once when it starts (``run_experiment``):
    each algorithm's option warnings (:func:`option_warnings`), and with
    ``eval.local_models`` on and more than ``LOCAL_MODELS_WARN_SITES`` sites, every method that keeps local
    models scores each site's model on every site's test split, K x K evaluations (K = 100: 10,000)."""
    lines = [line for n in cfg.algorithms for line in option_warnings(n, cfg, num_sites)]
    keeping = [n for n in cfg.algorithms if getattr(get_algorithm(n).server, "KEEPS_LOCAL_MODELS", False)]
    if not (cfg.eval.local_models and keeping and num_sites > LOCAL_MODELS_WARN_SITES):
        return lines
    k = num_sites
    return lines + [
        f"warning: eval.local_models is on: at test time {', '.join(keeping)} will score every site's local model on "
        f"every site's test split ({k} x {k} = {k * k} evaluations each); set eval.local_models=false to turn it off"
    ]


def option_warnings(name: str, cfg: RunConfig, num_sites: int) -> list[str]:
    """What algorithm ``name``'s options say about running on ``num_sites`` sites (an options model's
    ``site_warnings(num_sites, algorithm)``, e.g. SoftPull's lambda below 1/K)."""
    return get_algorithm(name).parse_options(cfg.methods.get(name)).site_warnings(num_sites, name)


def method_notes(cfg: RunConfig, task: Task, train_cases: Mapping[str, int] | None = None) -> list[str]:
    """Lines saying what a method's options mean on this run's network (an options model's ``run_note(task,
    algorithm)``, e.g. FedPer's share of private parameters) and, given each site's number of training cases
    (``train_cases``), on its local budget (:func:`one_step_notes`), shown once when the run starts."""
    notes = (get_algorithm(n).parse_options(cfg.methods.get(n)).run_note(task, n) for n in cfg.algorithms)
    lines = [note for note in notes if note is not None]
    return lines + (one_step_notes(task.cfg, train_cases) if train_cases else [])  # task.cfg: as trained (a plan)


def one_step_notes(cfg: RunConfig, train_cases: Mapping[str, int]) -> list[str]:
    """A line per method that trains exactly as FedAvg when a round is one local step (its options'
    ``ONE_STEP_AS_FEDAVG``: FedProx, whose proximal term is zero on a round's first step) and whose local budget
    (``local_budget()``, else ``train.budget``) is one SGD step per round at some site (``train_cases``: site ->
    training cases), e.g. an epoch of 3 cases in a batch of 4; for a method where that needs every site
    (``ONE_STEP_EVERY_SITE``: SCAFFOLD), only where every site trains one step and every site trains each round."""
    from fedseg.engine.sampling import sample_count
    from fedseg.train import budget_steps

    lines = []
    batch = cfg.train.batch_size
    for name in cfg.algorithms:
        options = get_algorithm(name).parse_options(cfg.methods.get(name))
        why = type(options).ONE_STEP_AS_FEDAVG
        if why is None or not options.one_step_as_fedavg():
            continue
        own = options.local_budget()
        budget = own or cfg.train.budget
        one = [site for site, n in train_cases.items() if n > 0 and budget_steps(budget, n, batch) == 1]
        if not one:
            continue
        sampled = sample_count(len(train_cases), cfg.fl.clients_per_round) < len(train_cases)  # (1 is one site)
        if type(options).ONE_STEP_EVERY_SITE and (len(one) < len(train_cases) or sampled):
            continue
        if budget.unit == "steps":  # every site alike
            where = "every site" if len(one) == len(train_cases) else ", ".join(one)
            said = f"methods.{name}.local_steps = 1" if own else "train.budget: 1 step"
        else:
            where = ", ".join(f"{site} ({train_cases[site]} training cases)" for site in one)
            said = f"batch size {batch}, train.budget: 1 epoch"
        verb = "train" if len(one) > 1 and where != "every site" else "trains"
        lines.append(
            f"{name}: {where} {verb} one local SGD step per round ({said}): {why}; a larger local budget "
            f"(train.budget, methods.{name}.local_steps) lets it differ"
        )
    return lines


def data_notes(
    cfg: RunConfig, kind: str, channel_names: list[str] | None = None, modalities: Mapping[str, str] | None = None
) -> list[str]:
    """Lines saying how a folder federation's images reach the network, shown once when the run starts: 3D volumes
    on the whole-image path (``data.volume.patch_size`` unset) are resized to ``data.image_size`` per axis (and
    scored there with ``eval.score_grid: model``; in voxels, without spacing, on their own grid by default), which a
    preset made for 2D images (``demo``) does without saying so;
    and a fixed ``eval.hd95_worst`` (the fets presets': BraTS's 373.13 mm) that every missed region of the folder's
    own cases scores, whatever their size; CT channels (``channel_names``, as the MSD and nnU-Net importers
    record them, or without them the DICOM series' Modality, ``modalities``: :func:`dicom_modalities`) normalized
    otherwise than in Hounsfield windows (``data.normalize: ct``); and DICOM series of several modalities (CT at one
    site, MR at another), whose intensities mean different things to one network."""
    if cfg.data.source != "folder":
        return []
    notes = []
    modalities = dict(modalities or {})
    ct_sites = [site for site, m in modalities.items() if m == "CT"]
    named_ct = any(str(name).strip().upper() == "CT" for name in channel_names or [])
    if (named_ct or (not channel_names and ct_sites)) and cfg.data.normalize != "ct":
        said = "federation.yaml channel_names" if named_ct else f"DICOM Modality at {', '.join(map(repr, ct_sites))}"
        notes.append(
            f"note: the images are CT ({said}) but data.normalize is {cfg.data.normalize}: "
            "Hounsfield units are usually clipped to a window and standardized (nnU-Net's CT normalization): "
            "--set data.normalize=ct --set 'data.ct_windows=[[-200, 300, 50, 100]]' (lower, upper, mean, std per "
            "channel: the window of your structures)"
        )
    if len(set(modalities.values())) > 1:
        by_modality: dict[str, list[str]] = {}
        for site, modality in modalities.items():
            by_modality.setdefault(modality, []).append(site)
        sites = "; ".join(f"{m}: {', '.join(map(repr, names))}" for m, names in sorted(by_modality.items()))
        notes.append(
            f"note: the sites' DICOM series are of different modalities ({sites}): one network learns intensities "
            "that mean different things at different sites; check that each site's images are the sequence you "
            "meant (channel_names in federation.yaml says it)"
        )
    if kind == "3d" and cfg.data.volume.patch_size is None:
        side = cfg.data.image_size
        notes.append(
            f"note: every volume is resized to {side}x{side}x{side} voxels (data.image_size, the whole-image path) "
            + (
                "and scored on that grid, not on its own"
                if cfg.eval.score_grid == "model"
                else "and its prediction resized back to be scored in voxels of its own grid, without its spacing"
            )
            + "; set data.volume.patch_size (as the fets preset does) to train on patches of each volume's own grid "
            "and score there, with its spacing"
        )
    if cfg.eval.hd95_worst is not None and cfg.eval.hd95:  # no HD95 is computed (eval.hd95: false): nothing to say
        notes.append(
            f"note: a missed or hallucinated region scores HD95 {cfg.eval.hd95_worst:g} on every case "
            "(eval.hd95_worst; the fets presets' 373.13 mm is the diagonal of a 240x240x155 BraTS volume at 1 mm); "
            "--set eval.hd95_worst=null scores it at the diagonal of its own case's grid"
        )
    return notes


GPU_PATCH = 96  # a patch side (voxels) from which a CPU step takes tens of seconds (fets: 128^3, 78 s per step)


SPACING_SPREAD = 1.5  # sites whose typical voxel sizes differ by more than this factor on an axis get a note


def spacing_notes(cfg: RunConfig, site_spacings: Mapping[str, list[tuple[float, ...]]]) -> list[str]:
    """On the volume path without ``data.volume.spacing``: a note where the sites' median voxel sizes (mm per axis,
    ``site_spacings``: each site's cases') differ by more than :data:`SPACING_SPREAD` on an axis, naming the two
    sites furthest apart: a patch of the same voxels then covers another physical size at each (a 1x1x3 mm site's
    32^3 patch is 32x32x96 mm), which the network is not told. Nothing for one site or with ``spacing`` set."""
    if cfg.data.volume.patch_size is None or cfg.data.volume.spacing is not None:
        return []
    typical = {site: np.median(np.asarray(s, dtype=np.float64), axis=0) for site, s in site_spacings.items() if s}
    if len(typical) < 2 or len({len(v) for v in typical.values()}) != 1:
        return []
    sites = list(typical)
    ratios = np.stack([typical[s] for s in sites])  # (sites, axes)
    axis = int(np.argmax(ratios.max(0) / ratios.min(0)))
    if ratios[:, axis].max() / ratios[:, axis].min() <= SPACING_SPREAD:
        return []
    fine, coarse = sites[int(np.argmin(ratios[:, axis]))], sites[int(np.argmax(ratios[:, axis]))]

    def mm(site: str) -> str:
        return "x".join(f"{v:.3g}" for v in typical[site]) + " mm"

    return [
        f"note: the sites' voxels differ in size ({fine}: {mm(fine)}, {coarse}: {mm(coarse)}, medians) and "
        "data.volume.spacing is unset: a patch of the same voxels covers another physical size at each site; "
        "set data.volume.spacing (e.g. the finest site's) to resample every case to one grid"
    ]


def unannotated_notes(site_data: Sequence[SiteData]) -> list[str]:
    """One line per site whose training split held cases without an annotated voxel (an ignore label: partial
    annotations; ``fedseg.data.dataset.trains_nothing``): they are not trained on and not counted in the site's
    aggregation weight (``SiteData.unannotated_train``); none for any other site."""
    return [
        f"note: site {s.name}: {s.unannotated_train} of {len(s.train) + s.unannotated_train} training cases have no "
        "annotated voxel (only the ignore label): not trained on and not counted in its aggregation weight"
        for s in site_data
        if s.unannotated_train
    ]


def prepared_notes(site_data: Sequence[SiteData]) -> list[str]:
    """What preparing the sites' data found: a line per site whose training cases without an annotated voxel were
    left out (:func:`unannotated_notes`), then a line saying how many of the sites' cases came from the prepared-case
    cache (``$FEDSEG_PREPARED_CACHE``, ``fedseg.data.prepared``) and how many were prepared and stored there (none
    when it took no part)."""
    from fedseg.data.prepared import PREPARED_CACHE_ENV, cache_root

    notes = unannotated_notes(site_data)
    read, stored = (sum(s.cache_counts[i] for s in site_data) for i in (0, 1))
    if not read and not stored:
        return notes
    cases = sum(len(s.train) + s.unannotated_train + len(s.val) + len(s.test) for s in site_data)
    return notes + [
        f"note: {read} of {cases} cases read from the prepared-case cache {cache_root()} ({PREPARED_CACHE_ENV}), "
        f"{stored} prepared and stored there"
    ]


def device_notes(cfg: RunConfig, device: torch.device) -> list[str]:
    """A line when the run trains a GPU-sized setup on the CPU: 3D patches of ``GPU_PATCH`` voxels a side or more
    (the ``fets`` preset's 128^3 DynUNet takes about 78 s per SGD step on 2 cores, ``docs/performance.md``), where a
    run would print nothing for hours; the ``fets-cpu`` preset is its CPU-sized setup."""
    side = cfg.data.volume.patch_size
    if device.type != "cpu" or side is None or min(side if isinstance(side, (list, tuple)) else [side]) < GPU_PATCH:
        return []
    return [
        f"note: {side}-voxel patches on the CPU (data.volume.patch_size): a GPU-sized setup, where one SGD step takes "
        "tens of seconds to minutes and a round far longer; give --device cuda, or the fets-cpu preset (32^3 "
        "patches) for a CPU"
    ]


def check_secure_aggregation(cfg: RunConfig, in_process: bool) -> None:
    """Refuse ``fl.secure_aggregation`` on an in-process engine (the simulator or the worker pool): only Flower
    masks the sites' updates (``fedseg.flower.secure``)."""
    if in_process and cfg.fl.secure_aggregation != "off":
        raise ValueError(SIMULATOR_REFUSAL)
