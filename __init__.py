"""specedge: on-device speculative decoding for small language models, losslessly.

`specedge.Engine` (apps/api.py) is the embeddable API; it and the call types (grammar specs JsonSchema, JsonObject,
Regex, Lark, Gbnf; Tool, ToolCall, ForceTool; ChatResult, TokenLogprob) and `specedge.open_embedder` (embedding
models, assembly/embedding.py) are imported on first use so that
`import specedge` stays light.
"""
__all__ = ["Engine", "ChatResult", "JsonSchema", "JsonObject", "Regex", "Lark", "Gbnf", "Tool", "ToolCall", "ForceTool",
           "TokenLogprob", "open_embedder", "__version__"]
_LAZY = {"Engine": "apps.api", "ChatResult": "apps.api", "Tool": "apps.tools", "ToolCall": "apps.tools",
         "ForceTool": "apps.tools", "JsonSchema": "runtime.constraint", "JsonObject": "runtime.constraint",
         "Regex": "runtime.constraint", "Lark": "runtime.constraint", "Gbnf": "runtime.constraint",
         "TokenLogprob": "runtime.types", "open_embedder": "assembly.embedding"}


def __getattr__(name: str):
    # Imported on first use, not at module level: the version's one home (_version.py) is read by the exporters
    # without importing the apps, and pytest imports this file on its own (no relative imports at import time).
    if name == "__version__":
        from ._version import __version__
        return __version__
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specedge' has no attribute {name!r}")
