"""slimpack: cost-balanced slicing and packing of variable-length samples for hybrid-parallel training.

Everything under this package except ``slimpack.runtime`` imports without torch.
"""

__version__ = "0.1.0"
