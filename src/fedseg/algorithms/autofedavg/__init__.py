"""Auto-FedAvg (Xia et al., 2021): aggregation weights learned by the sites (:mod:`.method`), the
map from beta to alpha and the layer groups (:mod:`.weights`), its report sections (:mod:`.report`)."""
