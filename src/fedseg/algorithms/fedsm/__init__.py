"""The FedSM family (Xu et al., CVPR 2022): everything about it lives in this package.

- ``method``: FedSM (Algorithm 1 training, Algorithm 2 inference with threshold gamma);
- ``extra``: FedSM-extra (Sec. 3.1.2, Eq. 1) and the ensemble selector (Sec. 3.1.1);
- ``model``: the super model (global + personalized models + selector), routing, bundles;
- ``options``: the family's options (the selector's; FedSM's threshold grid);
- ``selector``: the VGG-11-style model selector network;
- ``personalize``: how the personalized models are made (SoftPull and paper Table 6's alternatives);
- ``family``: the family's hooks on a run (``fedseg.algorithms.registry.Family``):
  ``features`` (the selector's view of the test images, Fig. 3), ``report`` (its report
  sections), ``unseen`` (scoring on a site never seen, Table 5), ``routing`` (how ``fedseg predict``
  applies a trained super model).
"""
