"""Presentation primitives shared by the run report (:mod:`fedseg.report`) and by a method family's own
report sections (e.g. :mod:`fedseg.algorithms.fedsm.report`): HTML tables and the run's files
(:mod:`.kit`), matplotlib figures and the colour palette (:mod:`.figures`). They sit below the
algorithms; the report pages, which read the algorithm registry, sit above them."""
