"""slimpack: cost-balanced slicing and packing of variable-length samples for hybrid-parallel training.

The Python API is ``slimpack.api`` (``from slimpack import api``; docs/api.md). Everything under this
package except ``slimpack.runtime`` and ``slimpack.integrations.hf`` imports without torch.
"""

__version__ = "0.1.0"
