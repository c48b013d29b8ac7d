"""Workloads: one small file each (model + loss + metrics), picked by name in params.yaml.

A workload knows nothing about distribution, devices or tracking; see scalelab.workloads for the
interface. Copy mlp.py to start a new one.
"""
