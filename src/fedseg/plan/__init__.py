"""Federated planning (``model.name: planned``): nnU-Net v2's fingerprint and planning rules across sites.

``fingerprint``: what a site computes on its training cases and sends (statistics only); ``merge``: the
server's merge (what is exact, what approximate); ``planner``: the rules (target spacing, patch size, network,
normalization) and how a plan sets the run's config; ``federated``: the exchanges that collect it.
"""
