"""VocabTrim at run time (docs/algorithms.md 2.2): a drafter whose LM head keeps N of the V vocabulary rows.

A trimmed drafter computes logits [T, N]; `expand_logits` scatters them into [T, V] rows that are -inf off the list,
so the one `logits_to_probs` gives q with exact zeros there: a drafted index j is token ids[j], chain speculative
sampling (1.1) stays lossless (an off-list token can only come from the residual, which keeps the off-list mass), and
greedy decoding emits the target's argmax as always.

The artifact's manifest section `drafter_vocab` (written by export/vocab_trim.py) names the id list, the trimmed
decoder (a separate drafter) and the standalone head (hidden states -> trimmed logits, for self-speculative drafters).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np

from ..models.errors import ModelFileError
from ..models.manifest import Manifest
from .types import Logits


@dataclass(frozen=True)
class DrafterVocab:
    ids: np.ndarray  # int32 [N], ascending: drafted index j is token ids[j]
    vocab_size: int  # V of the full model
    model: str  # the trimmed decoder's file in the artifact
    head: str | None  # the standalone trimmed head's file
    calibration: dict | None

    @property
    def n(self) -> int:
        return int(len(self.ids))


def read_drafter_vocab(manifest: Manifest) -> DrafterVocab | None:
    """The artifact's trimmed drafter vocabulary, None when it was exported without --drafter-vocab.

    requires: the manifest's files verified (read_manifest(verify=True)) when the ids must be trusted.
    """
    sec = manifest.raw.get("drafter_vocab")
    if sec is None:
        return None
    try:
        ids = np.asarray(json.loads((manifest.root / sec["file"]).read_text("utf-8"))["ids"], dtype=np.int32)
        vocab = DrafterVocab(ids, int(sec["vocab_size"]), str(sec["model"]), sec.get("head"), sec.get("calibration"))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{manifest.root}: bad drafter_vocab section or id file ({e}); re-export with "
                             "--drafter-vocab N") from None
    if vocab.n != int(sec.get("n", -1)) or vocab.n == 0 or np.any(np.diff(ids) <= 0) or ids[0] < 0 \
            or ids[-1] >= vocab.vocab_size or vocab.vocab_size != manifest.config.vocab_size:
        raise ModelFileError(f"{manifest.root}/{sec['file']}: the ids are not {sec.get('n')} ascending ids below "
                             f"{manifest.config.vocab_size}; re-export with --drafter-vocab N")
    return vocab


def drafter_manifest(manifest: Manifest, vocab: DrafterVocab) -> Manifest:
    """The same artifact with the trimmed decoder as its graph (same config, KV layout and IO names; logits [T, N])."""
    return dataclasses.replace(manifest, raw={**manifest.raw, "model": vocab.model})


def expand_logits(logits: Logits, ids: np.ndarray, vocab_size: int) -> Logits:
    """[T, N] trimmed logits -> [T, V] with -inf off the list (q = 0 there after logits_to_probs).

    Example: ids [1, 3], V 4: [[2.0, 5.0]] -> [[-inf, 2.0, -inf, 5.0]].
    """
    logits = np.atleast_2d(logits)
    full = np.full((logits.shape[0], vocab_size), -np.inf, dtype=np.float32)
    full[:, ids] = logits
    return full


class TrimmedHead:
    """head.onnx in an ONNX Runtime session: hidden states [T, D] (before the final norm) -> logits [T, N]."""

    def __init__(self, manifest: Manifest, vocab: DrafterVocab, threads: int | None = None) -> None:
        if vocab.head is None:
            raise ModelFileError(f"{manifest.root}: this artifact has no standalone head; re-export with "
                                 "--drafter-vocab N")
        import onnxruntime as ort

        from .backends.ort_threads import session_options
        opts, _ = session_options(ort, threads or 1)
        self.io = manifest.raw["drafter_vocab"].get("head_io", {"hidden": "hidden", "logits": "logits"})
        self.session = ort.InferenceSession(str(manifest.root / vocab.head), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.ids = vocab.ids

    def logits(self, h: np.ndarray) -> Logits:
        """float32 [T, N]; column j is token ids[j]."""
        return self.session.run([self.io["logits"]], {self.io["hidden"]: np.asarray(h, np.float32)})[0]
