"""Errors raised while reading, pulling or validating model files."""
from __future__ import annotations


class ModelFileError(ValueError):
    """A model file is missing, corrupt, of an unsupported kind, or failed verification.

    The message names the file and says what to do (usually: re-pull it or pick another file).
    """
