"""transformers' causal-mask shortcut answered on the host, so a forward pass never waits for the GPU.

Before building an SDPA mask, transformers asks ``masking_utils._ignore_causal_mask_sdpa`` whether
the batch's 2D padding mask holds any padding (none: the mask is skipped and SDPA runs causal). It
finds out by reducing the mask on the device and reading the answer back: two synchronising reads
per forward pass, each of which makes the host wait until the GPU has finished all it queued before
(the previous batch), so the host cannot queue a batch's work ahead of the GPU
(``bench/score/sync_points.py`` found these two, and no other, in a batch's launch; what taking them
out did to the loop is in docs/benchmarks.md's changelog).

The caller knows from the host-side lengths whether its batch is padded. Inside
:func:`known_padding` the question is answered from that for a forward without a cache (query and
key lengths equal, no offset), with transformers' own answer: ``False`` for a padded batch (every
path of that function returns ``False`` when the padding mask is not all ones and nothing is cached),
and, unpadded, the function itself with no padding mask (as for an all-ones mask). Anything else,
or a transformers without that function, goes to the original unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Iterator

#: the checked function's signature, read once (every scoring batch enters :func:`known_padding`)
_signature = functools.lru_cache(maxsize=4)(inspect.signature)


@contextlib.contextmanager
def known_padding(padded: bool | None) -> Iterator[None]:
    """While inside, transformers' SDPA causal-mask check reads ``padded`` (whether any row of the
    batch is padded) instead of the device. ``None``: unchanged."""
    if padded is None:
        yield
        return
    try:
        from transformers import masking_utils

        original = masking_utils._ignore_causal_mask_sdpa
        signature = _signature(original)
    except (ImportError, AttributeError, TypeError, ValueError):
        yield
        return

    def ignore(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        given = bound.arguments
        mask = given.get("padding_mask")
        q_length = given.get("q_length", given.get("query_length"))
        kv_length = given.get("kv_length")
        if (
            mask is None
            or not isinstance(q_length, int)
            or q_length != kv_length
            or not _zero(given.get("kv_offset", 0))
            or not _zero(given.get("q_offset", 0))  # a cached prefix, or a tensor offset (static caches)
            or tuple(mask.shape[-1:]) != (kv_length,)
        ):
            return original(*args, **kwargs)
        if padded:
            return False
        given["padding_mask"] = None
        return original(*bound.args, **bound.kwargs)

    masking_utils._ignore_causal_mask_sdpa = ignore
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = original


def _zero(offset) -> bool:
    return type(offset) is int and offset == 0
