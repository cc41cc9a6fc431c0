"""Pattern.head_slice: a pattern over a slice of the heads means what those heads mean in the whole."""
import json

import numpy as np
import pytest
import torch

import attnjit
from conftest import example_specs


def _loadable():
    out = []
    for path in example_specs():
        try:
            out.append((path.stem, attnjit.Pattern.load(path)))
        except attnjit.PatternError:
            pass
    return out


@pytest.mark.parametrize("name,p", _loadable(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_example_reads_back_and_slices_to_its_heads(name, p):
    # The full spec attnjit writes means the same pattern.
    assert attnjit.Pattern(attnjit._attnjit.spec_json(p.spec)) == p
    heads, seq = 8, 384
    whole = p.mask(seq, heads)
    given = json.loads(p.spec)
    if given.get("combine") == "head_groups" and given.get("group_scale", "mean") == "mean":
        with pytest.raises(attnjit.AttnjitError, match="group_scale"):
            p.head_slice(0, 4, heads)
        return
    for count in (1, 2, 4):
        for first in range(0, heads, count):
            part = p.head_slice(first, count, heads)
            np.testing.assert_array_equal(part.mask(seq, count), whole[first:first + count],
                                          err_msg=f"{name}: heads [{first}, {first + count})")


@pytest.mark.parametrize("rule", ["head_mod", "head_block", "torchscale"])
def test_offset_rules_at_head_counts_the_dilation_does_not_divide(rule):
    p = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": 24, "dilation": 4, "offset": rule}, {"segment": 48, "dilation": 3, "offset": rule, "heads": [1, 2, 5]}]})
    whole = p.mask(96, 6)
    for count in (1, 2, 3):
        for first in range(0, 7 - count):
            np.testing.assert_array_equal(p.head_slice(first, count, 6).mask(96, count), whole[first:first + count])


def test_random_blocks_and_per_head_lists_follow_their_heads():
    p = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": "full", "layout": {"union": [
        {"block": 16, "random": {"density": 0.3, "seed": 11}},
        {"block": 16, "explicit": {"per_head": [[[0, 1]], [[1, 0]], [[2, 2]], [[3, 0]]]}}]}}]})
    whole = p.mask(64, 4)
    assert not np.array_equal(whole[0], whole[2])  # the heads differ, so a slice that ignored them would fail
    for first in range(4):
        part = p.head_slice(first, 1, 4)
        assert f"head_base={first}" in part.canonical or first == 0
        np.testing.assert_array_equal(part.mask(64, 1), whole[first:first + 1])
    # head_base in a spec: head 0 of the call hashes as head 3.
    based = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": "full", "layout": {"block": 16, "random": {"density": 0.3, "seed": 11, "head_base": 3}}}]})
    plain = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": "full", "layout": {"block": 16, "random": {"density": 0.3, "seed": 11}}}]})
    np.testing.assert_array_equal(based.mask(64, 1)[0], plain.mask(64, 4)[3])
    with pytest.raises(attnjit.PatternError, match="head_base must lie in"):
        attnjit.Pattern.from_json({"attnjit": 1, "branches": [
            {"segment": "full", "layout": {"block": 16, "random": {"density": 0.3, "head_base": -1}}}]})


def test_head_groups_without_a_scale_give_the_same_output_and_lse():
    spec = {"attnjit": 1, "combine": "head_groups", "group_scale": "none",
            "branches": [{"segment": 32, "dilation": 1}, {"segment": 64, "dilation": 2}, {"segment": 128, "dilation": 4}]}
    p = attnjit.Pattern.from_json(spec)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 128, 6, 16, dtype=torch.float64, generator=g) for _ in range(3))
    o, lse = attnjit.attention(q, k, v, p, return_lse=True)
    for first, count in ((0, 2), (2, 2), (4, 2), (1, 3), (5, 1)):
        part = p.head_slice(first, count, 6)
        assert "head_groups" not in part.canonical
        hs = slice(first, first + count)
        po, plse = attnjit.attention(q[:, :, hs], k[:, :, hs], v[:, :, hs], part, return_lse=True)
        torch.testing.assert_close(po, o[:, :, hs], rtol=0, atol=0)
        torch.testing.assert_close(plse, lse[:, hs], rtol=0, atol=0)


def test_bad_slices_say_what_to_change():
    p = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 64, "heads": [0, 1]}]})
    with pytest.raises(attnjit.AttnjitError, match=r"does not lie in the 4 query heads"):
        p.head_slice(3, 2, 4)
    # Heads no branch takes part in attend nothing, in a slice as in the whole.
    assert not p.head_slice(2, 2, 4).mask(128, 2).any() and p.mask(128, 4)[2:].sum() == 0
    # The whole call's checks hold for a slice too (a slice would otherwise keep only its share).
    with pytest.raises(attnjit.AttnjitError, match="7"):
        attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 64, "heads": [0, 7]}]}).head_slice(0, 2, 4)
    groups = attnjit.Pattern.from_json({"attnjit": 1, "combine": "head_groups", "group_scale": "none",
                                        "branches": [{"segment": 8}, {"segment": 16}, {"segment": 32}]})
    with pytest.raises(attnjit.AttnjitError, match="head"):
        groups.head_slice(0, 1, 2)
    dyn = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": "full", "layout": {"dynamic": True}}]})
    with pytest.raises(attnjit.AttnjitError, match="given at run time"):
        dyn.head_slice(0, 1, 2)
    per_head = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": "full", "layout": {"block": 16, "explicit": {"per_head": [[[0, 0]], [[0, 0]]]}}}]})
    with pytest.raises(attnjit.AttnjitError, match="has 2 lists but the call has 4 query heads"):
        per_head.head_slice(0, 2, 4)
