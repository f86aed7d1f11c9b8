"""The drafter registry (runtime/drafters): typed specs parse and render back, each kind builds from its spec and
the assembly layer's inputs with its start-up checks, and the decode loop reads declared capabilities only."""
import re
from pathlib import Path

import numpy as np
import pytest

from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.draft_stop import ConfidenceStop, LogisticStop, StopKind, StopSpec
from specedge.runtime.drafters import (BackendNeed, BUILDERS, DelSpec, DraftModel, DrafterInputs, DrafterKind,
                                       DrafterSpec, ExitSpec, LoraDropSpec, ModelSpec, NgramSpec, NoneSpec,
                                       RecycleSpec, SkipSpec, SwiftSpec, build_drafter, parse_drafter)
from specedge.runtime.drafters.dytree import DynamicTreeDrafter
from specedge.runtime.drafters.early_exit import DelDrafter, EarlyExitDrafter
from specedge.runtime.drafters.layerskip import LayerSkipDrafter, SwiftDrafter
from specedge.runtime.drafters.lookup import LookupModelDrafter
from specedge.runtime.drafters.loradrop import LoRADropDrafter
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.drafters.recycle import RecycleDrafter
from specedge.runtime.loradrop import droppable_layers, pure_reuse
from test_numpy_backend import random_weights

SPECS = {
    "none": NoneSpec(), "ngram": NgramSpec(), "recycle:8": RecycleSpec(8), "model:x": ModelSpec("x"),
    "model:a+b.gguf": ModelSpec("a+b.gguf"), "model:x+conf:0.4": ModelSpec("x", StopSpec(StopKind.CONF, 0.4)),
    "model:x+tree:16": ModelSpec("x", tree=16), "model:x+logistic+lookup:3": ModelSpec(
        "x", StopSpec(StopKind.LOGISTIC), lookup=3), "skip:1.5": SkipSpec(1.5), "skip:2+conf": SkipSpec(
        2.0, StopSpec(StopKind.CONF)), "swift": SwiftSpec(), "exit:3+logistic:0.6": ExitSpec(
        3, StopSpec(StopKind.LOGISTIC, 0.6)), "del": DelSpec(), "loradrop": LoraDropSpec(),
    "loradrop:/fits/r8": LoraDropSpec("/fits/r8"),
}


@pytest.mark.parametrize("text", list(SPECS))
def test_specs_parse_to_their_type_and_render_back(text):
    spec = parse_drafter(text)
    assert spec == SPECS[text] and DrafterSpec.parse(text) == spec
    assert str(spec) == text and parse_drafter(str(spec)) == spec


@pytest.mark.parametrize("text, canonical", [("recycle", "recycle:16"), ("model:x+tree", "model:x+tree:16"),
                                             ("model:x+lookup", "model:x+lookup:2"), ("skip:2.0", "skip:2"),
                                             ("del+conf:0.40", "del+conf:0.4")])
def test_defaults_render_in_canonical_form(text, canonical):
    assert str(parse_drafter(text)) == canonical and parse_drafter(canonical) == parse_drafter(text)


@pytest.mark.parametrize("bad, msg", [
    ("bogus", "unknown drafter 'bogus'; use none, ngram"), ("recycle:big", "node count, as recycle:16"),
    ("recycle+conf", "without probabilities; drop the \\+conf"), ("ngram+conf", "needs a drafter with probabilities"),
    ("skip", "only model:<name-or-path>, skip:<R>, exit:<layer>"), ("exit:3.5", "expected exit:<layer> with a number"),
    ("model:x+conf:abc", "the argument must be a number"), ("model:x+conf:2", "confidence threshold must be in"),
    ("model:x+conf+tree", "without a draft stop"), ("model:x+tree:300", "node count in 1..256"),
    ("ngram+lookup", "follows a chain model drafter"), ("model:x+lookup:4", "1, 2 or 3 tokens"),
    ("loradrop+conf", "takes no draft stop")])
def test_bad_specs_fail_with_the_fix(bad, msg):
    with pytest.raises(ValueError, match=msg):
        parse_drafter(bad)


def test_stop_specs_build_fresh_policies():
    assert isinstance(StopSpec.parse("conf").build(), ConfidenceStop)
    fixed = StopSpec.parse("conf:0.3").build()
    assert fixed.threshold == 0.3 and not fixed.refit
    assert isinstance(StopSpec.parse("logistic:0.5").build(), LogisticStop)
    spec = StopSpec.parse("conf")
    assert spec.build() is not spec.build()  # each drafter learns its own threshold


def test_specs_declare_their_needs():
    assert ModelSpec("x").needs_draft and not ModelSpec("x").needs_corrections
    assert LoraDropSpec().needs_corrections and not LoraDropSpec().needs_draft
    assert ModelSpec("x", tree=8).backend_needs == {BackendNeed.TREE_MASK} and ModelSpec("x").backend_needs == set()
    assert RecycleSpec().backend_needs == {BackendNeed.TREE_MASK} and RecycleSpec().is_tree
    for s in (SkipSpec(2.0), SwiftSpec(), ExitSpec(2), DelSpec()):
        assert s.backend_needs == {BackendNeed.LAYER_PLAN}
    assert LoraDropSpec().backend_needs == {BackendNeed.LAYER_REUSE}
    assert set(BUILDERS) == set(DrafterKind)


@pytest.fixture(scope="module")
def target():
    return NumpyBackend(random_weights(0, n_layers=4), dtype=np.float64)


def test_every_kind_builds_from_its_spec_and_inputs(target):
    draft = DraftModel(target, "tiny", max_len=64)
    corr = pure_reuse(target.config.d_model, droppable_layers(target.config.n_layers), 4)
    inputs = DrafterInputs(target, draft, corr)
    want = {"none": type(None), "ngram": NgramDrafter, "recycle:8": RecycleDrafter, "model:x": ModelDrafter,
            "model:x+tree:16": DynamicTreeDrafter, "model:x+logistic+lookup:3": LookupModelDrafter,
            "skip:1.5": LayerSkipDrafter, "swift": SwiftDrafter, "exit:3+logistic:0.6": EarlyExitDrafter,
            "del": DelDrafter, "loradrop": LoRADropDrafter}
    for text, cls in want.items():
        d = build_drafter(parse_drafter(text), inputs)
        assert type(d) is cls, text
    assert build_drafter(ModelSpec("tiny"), inputs).name == "model:tiny"
    trimmed = DraftModel(target, "tiny", np.arange(10, dtype=np.int32))
    assert build_drafter(ModelSpec("tiny"), DrafterInputs(target, trimmed)).name == "model:tiny (vocab 10)"
    assert isinstance(build_drafter(ModelSpec("x", StopSpec(StopKind.CONF)), inputs).stop, ConfidenceStop)


def test_build_checks_inputs_and_the_target_at_start_up(target):
    with pytest.raises(ValueError, match="needs a loaded draft model"):
        build_drafter(ModelSpec("x"), DrafterInputs(target))
    with pytest.raises(ValueError, match="needs LoRA-Drop corrections"):
        build_drafter(LoraDropSpec(), DrafterInputs(target))
    chain_only = MarkovBackend(random_markov_table(5, seed=0))
    with pytest.raises(ValueError, match="cannot verify token trees"):
        build_drafter(RecycleSpec(8), DrafterInputs(chain_only))
    with pytest.raises(ValueError, match="the skip:2 drafter runs the target's own layers"):
        build_drafter(SkipSpec(2.0), DrafterInputs(chain_only))
    with pytest.raises(ValueError, match="drop steps"):
        build_drafter(LoraDropSpec(), DrafterInputs(chain_only, corrections=pure_reuse(4, (1,), 4)))


def test_the_decode_loop_reads_declared_capabilities_not_attributes():
    root = Path(__file__).resolve().parents[1] / "runtime"
    for name in ("decode.py", "steppers.py", "generate.py", "session.py", "lossy.py"):
        assert not re.search(r"\b(hasattr|getattr)\(", (root / name).read_text()), name
