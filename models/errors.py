"""Errors raised while reading, pulling or validating model files."""
from __future__ import annotations


class ModelFileError(ValueError):
    """A model file is missing, corrupt, of an unsupported kind, or failed verification.

    The message names the file and says what to do (usually: re-pull it or pick another file).
    """


class UnsupportedModelError(ModelFileError):
    """A sound file of a kind our own code does not implement: an architecture without a family module
    (models/families.py), or a tokenizer model / pre-tokenizer models/tokenizer_gguf.py cannot build.

    llama.cpp may still run it: the llama.cpp backend loads such a GGUF with llama.cpp's own tokenizer
    (assembly/load.py); the NumPy backend, ONNX export and self-speculative drafters refuse it with this message.
    """
