"""specedge: on-device speculative decoding for small language models, losslessly.

`specedge.Engine` (apps/api.py) is the embeddable API; it is imported on first use so that `import specedge` stays
light.
"""
from ._version import __version__  # noqa: F401  (one place, imported by the exporters without the apps)
__all__ = ["Engine"]


def __getattr__(name: str):
    if name == "Engine":
        from .apps.api import Engine
        return Engine
    raise AttributeError(f"module 'specedge' has no attribute {name!r}")
