"""Parsing what a user names on the command line into typed settings."""
from __future__ import annotations

def parse_target(text: str, default_model: str):
    """'onnx:/path/to/artifact' | 'llamacpp' | 'numpy:model.gguf' -> (BackendKind, model)."""
    from ..runtime.backends import BackendKind
    kind, _, model = text.partition(":")
    try:
        return BackendKind(kind), model or default_model
    except ValueError:
        raise ValueError(f"unknown target backend {kind!r} in {text!r}; use "
                         f"{', '.join(k.value for k in BackendKind)}[:model]") from None
