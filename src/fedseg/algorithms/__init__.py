"""Federated algorithms, registered by name. Each module holds a Server and a Client class."""

from fedseg.algorithms.centralized import CentralizedClient, CentralizedServer
from fedseg.algorithms.fedadam import FedAdamClient, FedAdamOptions, FedAdamServer
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer, FedAvgStepsOptions, FedAvgUniformOptions
from fedseg.algorithms.fedmedian import FedMedianClient, FedMedianOptions, FedMedianServer
from fedseg.algorithms.fednova import FedNovaClient, FedNovaOptions, FedNovaServer
from fedseg.algorithms.fedpidavg import FedPIDAvgClient, FedPIDAvgOptions, FedPIDAvgServer
from fedseg.algorithms.fedsm import FedSMClient, FedSMOptions, FedSMServer
from fedseg.algorithms.fedsm_extra import (
    FedSMEnsembleClient,
    FedSMEnsembleOptions,
    FedSMEnsembleServer,
    FedSMExtraClient,
    FedSMExtraOptions,
    FedSMExtraServer,
)
from fedseg.algorithms.fedprox import FedProxClient, FedProxOptions, FedProxServer
from fedseg.algorithms.fedtrimmedavg import FedTrimmedAvgClient, FedTrimmedAvgOptions, FedTrimmedAvgServer
from fedseg.algorithms.local import LocalClient, LocalServer
from fedseg.algorithms.qfedavg import QFedAvgClient, QFedAvgOptions, QFedAvgServer
from fedseg.algorithms.registry import ALGORITHMS, AlgorithmSpec, get_algorithm, register
from fedseg.algorithms.scaffold import ScaffoldClient, ScaffoldOptions, ScaffoldServer

register("centralized", CentralizedServer, CentralizedClient, "pooled training of every site's train split (upper bound, not private)")
register("local", LocalServer, LocalClient, "each site trains alone; cross-site matrix at test time")
register("fedavg", FedAvgServer, FedAvgClient, "FedAvg (McMahan et al.): weighted (samples | uniform) averaging of local models", FedAvgOptions)
register("fedavg-steps", FedAvgServer, FedAvgClient, "FedAvg with fixed local iterations (U steps per site and round, FeTS 3.2.2)", FedAvgStepsOptions)
register("fedavg-uniform", FedAvgServer, FedAvgClient, "FedAvg with fixed local epochs and uniform averaging (FeTS 3.2.2)", FedAvgUniformOptions)
register("fedprox", FedProxServer, FedProxClient, "FedProx (Li et al.): local proximal term (mu/2)||w - w_global||^2", FedProxOptions)
register("scaffold", ScaffoldServer, ScaffoldClient, "SCAFFOLD (Karimireddy et al.): control-variate corrected local steps (FeTS Eq. 6-9)", ScaffoldOptions)
register("fednova", FedNovaServer, FedNovaClient, "FedNova (Wang et al.): normalized averaging (general form or FeTS Eq. 4-5)", FedNovaOptions)
register("fedadam", FedAdamServer, FedAdamClient, "FedAdam (Reddi et al.): server-side Adam on the averaged update (FeTS Eq. 10-12)", FedAdamOptions)
register("fedmedian", FedMedianServer, FedMedianClient, "FedMedian: coordinate-wise median of the local models", FedMedianOptions)
register("fedtrimmedavg", FedTrimmedAvgServer, FedTrimmedAvgClient, "FedTrimmedAvg: coordinate-wise trimmed mean (cut beta at each end)", FedTrimmedAvgOptions)
register("qfedavg", QFedAvgServer, QFedAvgClient, "q-FedAvg (Li et al.): loss-powered fair merge, forward-only loss pass (FeTS Eq. 13-17)", QFedAvgOptions)
register("fedpidavg", FedPIDAvgServer, FedPIDAvgClient, "FedPIDAvg (Maechler et al.): weights from samples, val-loss gain and loss sum (FeTS Eq. 18-22)", FedPIDAvgOptions)
register("fedsm", FedSMServer, FedSMClient, "FedSM (Xu et al.): global + SoftPull personalized models + selector, threshold gamma (Alg. 1-2)", FedSMOptions, min_sites=2)
register("fedsm-extra", FedSMExtraServer, FedSMExtraClient, "FedSM-extra: models first, then extra selector rounds on Eq. 1 labels; argmax over K+1", FedSMExtraOptions, min_sites=2)
register("fedsm-ensemble", FedSMEnsembleServer, FedSMEnsembleClient, "FedSM ensemble: selector trained through the soft ensemble of K+1 models (Sec. 3.1.1)", FedSMEnsembleOptions, min_sites=2)

__all__ = ["ALGORITHMS", "AlgorithmSpec", "get_algorithm", "register"]
