"""attnjit.Pattern: a validated pattern spec (the JSON format of docs/spec.md)."""
import json
import os

import numpy as np

from . import _attnjit
from ._attnjit import PatternError
from ._inputs import scale_arg

SCALE_HINT = "; leave it out for 1/sqrt(head_dim)"


class Pattern:
    """A pattern spec, parsed and validated. Equal meanings have equal hashes.

    Pattern.load(path), Pattern.from_json(text or dict); `canonical` (the normalised text),
    `hash`, `spec` (the JSON text given); stats(...) and mask(...) for a shape.
    """

    def __init__(self, spec: str):
        if not isinstance(spec, str):
            raise TypeError(f"Pattern(spec): expected the JSON text of a spec, got {type(spec).__name__}")
        self._spec = spec
        self._canonical, self._hash = _attnjit.validate(spec)  # PatternError naming what is wrong
        # One line of JSON with the same meaning: what the custom ops carry. A graph compiler that
        # writes the op's arguments into generated source (Inductor) then never meets a newline.
        self._op_spec = json.dumps(json.loads(spec), separators=(",", ":"))

    @classmethod
    def load(cls, path):
        """The spec in the JSON file at `path`."""
        with open(os.fspath(path), encoding="utf-8") as f:
            return cls(f.read())

    @classmethod
    def from_json(cls, spec):
        """A spec given as JSON text or as a dict."""
        if isinstance(spec, dict):
            try:  # JSON has no NaN or infinity: json.dumps would write tokens no JSON reader takes
                text = json.dumps(spec, allow_nan=False)
            except ValueError as e:  # NaN, an infinity, or a dict that holds itself
                raise PatternError(f"pattern: a value in the dict is NaN or infinite, or the dict holds itself ({e}); "
                                   "JSON has no NaN or infinity: give finite numbers") from None
            return cls(text)
        if isinstance(spec, (str, bytes)):
            return cls(spec.decode() if isinstance(spec, bytes) else spec)
        raise TypeError(f"Pattern.from_json: expected a str or a dict, got {type(spec).__name__}")

    @property
    def canonical(self) -> str:
        return self._canonical

    @property
    def hash(self) -> str:
        return self._hash

    @property
    def spec(self) -> str:
        return self._spec

    @property
    def op_spec(self) -> str:
        """The spec as one line of JSON (what attnjit.attention passes to its custom ops)."""
        return self._op_spec

    def with_scale(self, scale: float) -> "Pattern":
        """The same pattern with softmax scale `scale` instead of its own (1/sqrt(head_dim) by default)."""
        scale = scale_arg("scale", scale, SCALE_HINT)  # json.dumps would write nan and inf as no JSON reads them
        d = json.loads(self._spec)
        d["scale"] = scale
        return Pattern(json.dumps(d))

    def head_slice(self, first: int, count: int, heads_q: int) -> "Pattern":
        """The pattern that query heads [first, first + count) of a `heads_q`-head call follow, as
        a pattern of `count` heads: its head j attends what head first + j attends here (offset
        rules resolved for those heads, `heads` lists renumbered, per-head blocks sliced, random
        layouts hashed from `first` on). What one rank of a head-parallel group computes."""
        return Pattern(_attnjit.head_slice(self._spec, int(first), int(count), int(heads_q)))

    def stats(self, seq_q, heads_q, seq_k=None, heads_kv=None, q_offset=0, k_offset=0) -> dict:
        """attended_pairs (over all heads, a key counted once per branch), pairs_per_head,
        pairs_per_branch, empty_rows and density for one shape; distinct_pairs and
        distinct_density count each (head, query, key) once however many branches attend it."""
        seq_k = seq_q if seq_k is None else seq_k
        heads_kv = heads_q if heads_kv is None else heads_kv
        return _attnjit.stats(self._spec, seq_q, heads_q, seq_k, heads_kv, q_offset, k_offset)

    def mask(self, seq_q, heads_q, seq_k=None, heads_kv=None, q_offset=0, k_offset=0) -> np.ndarray:
        """uint8 [heads_q, seq_q, seq_k]: how many branches attend each (head, query, key)."""
        seq_k = seq_q if seq_k is None else seq_k
        heads_kv = heads_q if heads_kv is None else heads_kv
        return _attnjit.mask(self._spec, seq_q, heads_q, seq_k, heads_kv, q_offset, k_offset)

    def __eq__(self, other):
        return isinstance(other, Pattern) and other._hash == self._hash

    def __hash__(self):
        return hash(self._hash)

    def __repr__(self):
        return f"attnjit.Pattern(hash={self._hash})"


def as_pattern(pattern) -> Pattern:
    """A Pattern from a Pattern, a dict, a path to a JSON file, or JSON text."""
    if isinstance(pattern, Pattern):
        return pattern
    if isinstance(pattern, dict):
        return Pattern.from_json(pattern)
    if isinstance(pattern, (str, os.PathLike)):
        text = os.fspath(pattern)
        if text.lstrip().startswith("{"):
            return Pattern(text)
        return Pattern.load(text)
    raise TypeError(f"pattern: expected an attnjit.Pattern, a dict or a path, got {type(pattern).__name__}")


def op_spec(pattern, scale=None) -> str:
    """The one-line spec the custom ops carry for `pattern` (a Pattern, a dict, a path or JSON text),
    with softmax scale `scale` instead of its own if given."""
    p = as_pattern(pattern)
    return (p if scale is None else p.with_scale(scale)).op_spec
