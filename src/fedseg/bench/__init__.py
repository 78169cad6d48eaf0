"""fedseg bench: declarative studies of methods x folds x seeds x federations (``fedseg.bench.spec``)."""
