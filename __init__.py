"""specedge: on-device speculative decoding for small language models, losslessly.

`specedge.Engine` (apps/api.py) is the embeddable API; it is imported on first use so that `import specedge` stays
light.
"""
__all__ = ["Engine", "__version__"]


def __getattr__(name: str):
    # Imported on first use, not at module level: the version's one home (_version.py) is read by the exporters
    # without importing the apps, and pytest imports this file on its own (no relative imports at import time).
    if name == "__version__":
        from ._version import __version__
        return __version__
    if name == "Engine":
        from .apps.api import Engine
        return Engine
    raise AttributeError(f"module 'specedge' has no attribute {name!r}")
