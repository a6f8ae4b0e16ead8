"""Model families behind one policy interface (see base.py)."""
from common.models.base import DiffusionPolicy, FamilySpec, PolicyOutput
from common.models.presets import FAMILIES, build_tiny_policy

__all__ = ["DiffusionPolicy", "FamilySpec", "PolicyOutput", "FAMILIES", "build_tiny_policy"]
