"""fedseg's Python API in one script, notebook style (each ``# %%`` block is a cell).

    .venv/bin/python examples/python_api.py [OUT]      # OUT (or $FEDSEG_EXAMPLE_OUT), default runs/python_api

1. register a custom method: FedAvg whose server merges the sites' models with equal weights;
2. build a config in Python (the built-in synthetic-retina federation, tiny) and run FedAvg + the custom method;
3. read the results: test Dice, per-case rows, paths; re-render the report;
4. register a custom federation built in memory and run on it (``data.source: <name>``).

Takes well under a minute on one CPU thread. Running it again resumes: the finished methods are reused.
"""

# %% setup
import os
import sys
from pathlib import Path

import numpy as np

from fedseg import (
    AlgorithmSpec,
    Case,
    Experiment,
    FedAvgClient,
    FedAvgServer,
    Federation,
    Regions,
    Results,
    Site,
    load_config,
    register_algorithm,
    register_federation,
)

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FEDSEG_EXAMPLE_OUT", "runs/python_api"))


# %% 1. a custom algorithm: FedAvg with every site weighted 1/K, whatever its number of training cases
class EqualWeightsServer(FedAvgServer):
    def aggregation_weights(self, replies):
        return {site: 1.0 for site in replies}


register_algorithm(
    AlgorithmSpec("fedavg-equal", "FedAvg (equal weights)", EqualWeightsServer, FedAvgClient, "FedAvg, p_k = 1/K"),
    replace=True,  # a notebook cell may run twice
)

# %% 2. a config built in Python: a preset plus overrides (a dict or a RunConfig work too), then run it
TINY = ["data.scale=0.05", "data.image_size=32", "model.channels=[4, 8, 16]", "train.batch_size=4", "threads=1"]
cfg = load_config(preset="synthetic-retina", overrides=[*TINY, "fl.rounds=2", "algorithms=[fedavg, fedavg-equal]"])
run_dir = OUT / "retina"
results = Experiment(cfg, run_dir, progress=False).run(resume=(run_dir / "config.yaml").is_file())

# %% 3. the results
for algorithm, dice in results.dice().items():
    print(f"test Dice {algorithm}: {dice:.4f}")
rows = results.cases(algorithm="fedavg-equal", metric="dice", scored=True)  # the rows results.dice() averages
print(f"{len(rows)} per-case Dice rows of fedavg-equal, e.g. {rows[0]}")
print("models:", {a: str(p) for a, p in results.model_dirs.items()})
print("report:", Results.load(run_dir).report())  # a finished run, opened again; its report re-rendered


# %% 4. a custom federation: two sites of noisy squares (label 1), built in memory from numpy arrays
def squares(cfg):
    rng = np.random.default_rng(cfg.data.seed)  # the dataset's seed: the same squares in every run seed
    size, sites = cfg.data.image_size, []
    for s, brightness in enumerate((60, 120)):
        cases = []
        for i in range(12):
            label = np.zeros((size, size), np.uint8)
            y, x = rng.integers(2, size // 2, 2)
            label[y : y + size // 3, x : x + size // 3] = 1
            image = rng.integers(0, 50, (1, size, size)).astype(np.uint8) + brightness * label
            cases.append(Case.from_arrays(f"s{s}_{i:02d}", image.astype(np.uint8), label))
        sites.append(Site(f"hospital{s + 1}", cases))
    return Federation("squares", "2d", 1, Regions.from_mapping({"square": [1]}), sites)


register_federation("squares", squares, sites=2, replace=True)
squares_cfg = load_config(
    preset="synthetic-retina", overrides=[*TINY, "data.source=squares", "fl.rounds=1", "algorithms=[fedavg-equal]"]
)
squares_dir = OUT / "squares"
on_squares = Experiment(squares_cfg, squares_dir, progress=False).run(resume=(squares_dir / "config.yaml").is_file())
print(f"test Dice fedavg-equal on squares: {on_squares.dice()['fedavg-equal']:.4f}")
