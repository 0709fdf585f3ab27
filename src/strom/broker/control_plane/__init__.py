"""Cluster metadata and the control plane that owns it (embedded single-node for now)."""
