"""fedseg.lean_monai: MONAI's unused integrations stay out of fedseg's processes, and nothing else changes.

Each check runs in a fresh interpreter (an import hook and ``sys.modules`` are per process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# lean_monai.UNUSED_BY_FEDSEG, spelled out
SKIPPED = ("mlflow", "sklearn", "matplotlib", "scipy.signal", "requests", "tensorboard", "jsonschema")

PROBE = """
import json, sys
SKIPPED = sys.argv[2:]
if sys.argv[1] == "lean":
    from fedseg import lean_monai
    lean_monai.install()
import torch
from monai.data import ITKReader
from monai.metrics import compute_dice
from monai.networks.nets import UNet
during = {m: m in sys.modules for m in SKIPPED}
import matplotlib, mlflow, scipy.signal, sklearn.manifold  # the real packages, after MONAI's import
import jsonschema, requests, torch.utils.tensorboard
torch.manual_seed(0)
net = UNet(2, 1, 2, (4, 8), (2,), num_res_units=0).eval()
with torch.no_grad():
    pred = net(torch.rand(1, 1, 16, 16)).argmax(1, keepdim=True)
truth = (torch.rand(1, 1, 16, 16) > 0.5).long()
dice = compute_dice(torch.cat([pred == 0, pred == 1], 1).float(), torch.cat([truth == 0, truth == 1], 1).float())
later = [matplotlib, mlflow, sklearn.manifold, jsonschema, requests, torch.utils.tensorboard]
print(json.dumps({"during": during, "later": [m.__name__ for m in later],
                  "itk_reader": ITKReader.__name__, "dice": dice.tolist()}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, *SKIPPED], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_hook_keeps_unused_integrations_out_and_changes_no_result():
    pytest.importorskip("mlflow")  # the tracking extra: what MONAI would import
    full, lean = probe("full"), probe("lean")
    assert all(full["during"].values()), full["during"]  # without the hook MONAI imports them (the hook matters)
    assert not any(lean["during"].values()), lean["during"]
    assert lean["later"] == full["later"]  # imported normally once MONAI is in
    assert lean["dice"] == full["dice"]  # MONAI's network and metric: same numbers


def test_fedseg_command_installs_the_hook():
    code = (
        "import sys; from fedseg.cli import app; from fedseg.lean_monai import SkipDuringMonaiImport\n"
        "app(['presets'], standalone_mode=False)\n"
        "assert any(isinstance(f, SkipDuringMonaiImport) for f in sys.meta_path)\n"
        "import monai.networks.nets\n"
        "assert 'mlflow' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_library_import_keeps_monai_whole():
    """``import fedseg`` and its API do not install the hook (a library user keeps MONAI's integrations)."""
    code = "import sys, fedseg, fedseg.api; from fedseg.lean_monai import SkipDuringMonaiImport\n"
    code += "assert not any(isinstance(f, SkipDuringMonaiImport) for f in sys.meta_path)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
