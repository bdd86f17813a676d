"""Huygens clock sync: purity filter, per-edge max-margin fit, network-effect correction."""
