"""The records of a bridge stream, as msgspec structs.

Rules for evolving them (see docs/format.md): fields are only ever added, each added field has a
default, a field's type never changes, and readers ignore fields they do not know. Adding a field is
a minor version bump; anything else is a major one.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from .spec import EOS, MAX_RESULT, PROMPT, RESPONSE

#: the JSON Schema's statement of a selection number's range (the reader checks it, format/validate.py; a
#: schema-only annotation: decoding does not)
_RESULT = msgspec.Meta(extra_json_schema={"minimum": -MAX_RESULT, "maximum": MAX_RESULT})


class Array(msgspec.Struct, frozen=True):
    """A dense little-endian numeric array: ``dtype`` is a numpy dtype name, ``shape`` its dimensions."""

    dtype: str
    shape: list[int]
    data: bytes

    @classmethod
    def of(cls, values: Any, dtype: str = "float32") -> "Array":
        # order="C", not np.ascontiguousarray: that one turns a 0-d array (shape []) into shape [1]
        arr = np.asarray(values, dtype=np.dtype(dtype).newbyteorder("<"), order="C")
        return cls(dtype=dtype, shape=list(arr.shape), data=arr.tobytes())

    def numpy(self, dtype: str | None = None) -> np.ndarray:
        """The values as a new (writable) array of this array's dtype, or converted to ``dtype``."""
        dt = _LITTLE.get(self.dtype)
        if dt is None:
            raise ValueError(f"unsupported array dtype {self.dtype!r}")
        expected = math.prod(self.shape) * dt.itemsize
        if len(self.data) != expected:
            raise ValueError(
                f"array of shape {self.shape} and dtype {self.dtype} needs {expected} bytes, has {len(self.data)}"
            )
        return np.frombuffer(self.data, dtype=dt).reshape(self.shape).astype(dtype or self.dtype)


ALLOWED_DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8")
_LITTLE = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}


class Tokens(msgspec.Struct):
    """The tokenised example. ``kinds[t]`` is one of spec.TEMPLATE/PROMPT/RESPONSE/EOS.
    ``offsets`` holds ``[start, end)`` character offsets into ``Example.text`` for every token,
    flattened as ``[s0, e0, s1, e1, ...]``; tokens with no characters have ``s == e``."""

    input_ids: list[int]
    kinds: bytes
    offsets: list[int]

    def positions(self, kind: int) -> np.ndarray:
        return np.flatnonzero(np.frombuffer(self.kinds, dtype=np.uint8) == kind)

    def prompt_positions(self) -> np.ndarray:
        return self.positions(PROMPT)

    def eligible(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt positions, response positions), from one reading of ``kinds``."""
        kinds = np.frombuffer(self.kinds, dtype=np.uint8)
        return np.flatnonzero(kinds == PROMPT), np.flatnonzero(kinds == RESPONSE)

    def response_positions(self) -> np.ndarray:
        return self.positions(RESPONSE)

    def eos_positions(self) -> np.ndarray:
        return self.positions(EOS)

    def spans(self) -> np.ndarray:
        return np.asarray(self.offsets, dtype=np.int64).reshape(-1, 2)


class Scores(msgspec.Struct):
    """What a scorer computed. Rows follow the eligible response positions in order, columns the
    eligible prompt positions in order.

    - ``a``: float32 [n]   validation-directed utility a_j = v . grad l_j
    - ``c``: float32 [n]   history mass: attention from r_j's query row to earlier response tokens
    - ``A``: float16 [n, m] response-to-prompt attention rows (head- and layer-averaged)
    - ``loss``: float32 [n] the per-token loss l_j at the scoring checkpoint
    - ``B``: float32 [n, m] (1.2, optional) the interaction matrix beta[j, i], estimated effect of prompt
      token i on a_j (e.g. the ``atp`` scorer's key-gate attribution); when present, ``select`` uses it in
      place of ``A[j, i] a_j``, with gamma_j = a_j - sum_i B[j, i]

    Every value lies within +-2^48 (``spec.MAX_QUANTITY``; no NaN, no infinity): docs/format.md, "Numbers".
    """

    scorer: str
    a: Array
    c: Array
    A: Array
    loss: Array | None = None
    B: Array | None = None


class Selection(msgspec.Struct):
    """The token-level selection. Positions are absolute token indices into ``Tokens.input_ids``.

    ``response_scores`` are the scores the closure step projects (for BRIDGE: Delta_r(j | S_p(T))),
    float32 over the eligible response positions. ``u_sur`` is U_sur after every update. Both lie within
    float32's range (``spec.MAX_RESULT``, +-3.4e38; no NaN, no infinity). The kept and protected positions
    are ascending."""

    method: str
    b_p: int
    b_r: int
    prompt_keep: list[int]
    response_keep: list[int]
    response_scores: Array
    u_sur: list[Annotated[float, _RESULT]] = []
    #: achieved retention |prompt_keep| / m and |response_keep| / n (None: no eligible tokens on that side,
    #: or a stream written before format 1.1)
    achieved_rho_p: float | None = None
    achieved_rho_r: float | None = None
    #: (1.2) protected tokens, absolute positions: prompt tokens always kept, response tokens always
    #: supervised (``select --protect-prompt/--protect-response``); they count against b_p / b_r
    protected_prompt: list[int] = []
    protected_response: list[int] = []
    #: (1.3) float32 [len(response_keep)]: the loss weight of each kept response token, in
    #: ``response_keep``'s order (``select --method importance``: inverse inclusion probabilities);
    #: None: every supervised token weighs 1
    response_weights: Array | None = None


class Closure(msgspec.Struct):
    """The structure-aware projection. ``units`` are ``[start, end)`` absolute token positions,
    flattened; ``chosen`` indexes ``units``; ``supervise`` is the final supervision set (absolute
    positions, sorted, EOS not included: it is always supervised): the chosen units' response
    positions, and ``filled`` (1.3)."""

    segmenter: str
    alpha: float
    units: list[int]
    chosen: list[int]
    supervise: list[int]
    #: (1.2) indices into ``units`` of the units forced in because they hold a protected response token
    #: (exactly those units, ascending)
    protected_units: list[int] = []
    #: (1.3) response positions supervised beyond the chosen units (``close --fill``: what spends the rest
    #: of b_r), ascending; ``supervise`` is the chosen units' positions and these
    filled: list[int] = []


class Reference(msgspec.Struct):
    """Per-token quantities of one model over the eligible positions, added by ``bridge reference``
    (format 1.1). ``prompt_*`` arrays follow the eligible prompt positions ``[m]``, ``response_*``
    the eligible response positions ``[n]``; all float32; absent parts are None.

    - ``*_loss``: -log p(x_t | x_<t), the next-token cross-entropy of token t under the model
    - ``response_attention``: last-layer, head-averaged attention from response token j's own query row
      onto every position before the first response token (ssToken's Attn)
    - ``*_received``: last-layer, head-averaged attention received by token t, summed over all query rows
    - ``*_grad``: ||dL/de_t||, L the example's mean SFT loss (response tokens and EOS), e_t the input embedding

    Every value lies within +-2^48 (``spec.MAX_QUANTITY``; no NaN, no infinity): docs/format.md, "Numbers".
    """

    model: str
    fingerprint: str = ""
    prompt_loss: Array | None = None
    response_loss: Array | None = None
    response_attention: Array | None = None
    prompt_received: Array | None = None
    response_received: Array | None = None
    prompt_grad: Array | None = None
    response_grad: Array | None = None


#: The names of a ``Reference``'s arrays (every field but ``model`` and ``fingerprint``), in order.
REFERENCE_ARRAYS: tuple[str, ...] = tuple(f for f in Reference.__struct_fields__ if f not in ("model", "fingerprint"))


class Example(msgspec.Struct, tag="example"):
    """One example; every step adds its part and passes the rest through unchanged."""

    id: str
    index: int
    text: str
    tokens: Tokens
    scores: Scores | None = None
    selection: Selection | None = None
    closure: Closure | None = None
    #: per-token losses (and more) of named models, from ``bridge reference`` (format 1.1)
    references: dict[str, Reference] = {}

    def stage(self) -> str:
        if self.closure is not None:
            return "closure"
        if self.selection is not None:
            return "selection"
        if self.scores is not None:
            return "scores"
        return "tokens"


class ModelInfo(msgspec.Struct):
    """Which model and tokenizer produced the tokens and scores."""

    source: str
    fingerprint: str
    tokenizer_fingerprint: str
    chat_template: bool = True


class Step(msgspec.Struct):
    """One pipeline step that touched the stream, with every parameter it used."""

    step: str
    producer: str
    time: str
    params: dict[str, Any] = {}


class Header(msgspec.Struct, tag="header"):
    stage: str
    producer: str
    created: str
    model: ModelInfo
    steps: list[Step] = []
    source: str = ""


class End(msgspec.Struct, tag="end"):
    """Closes a stream; ``count`` is the number of Example records (a reader checks it)."""

    count: int


Record = Union[Header, Example, End]
