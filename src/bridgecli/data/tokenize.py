"""Tokenise a prompt/response pair into token ids, per-token kinds and character offsets.

The text is cut into pieces: template text (role markers, BOS, system boilerplate the template
adds), prompt contents, the response content, and the end-of-turn token. Each piece is tokenised
on its own (so no token straddles a boundary) and the pieces' tokens are concatenated. Template
pieces and special tokens are ``TEMPLATE`` (always kept, never budgeted); the token that ends the
response is ``EOS`` (always supervised); anything the template renders after it is dropped.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

from ..errors import InputError
from ..format.records import Tokens
from ..format.spec import EOS, PROMPT, RESPONSE, TEMPLATE
from .shapes import Pair

_MARK = "\ue000bridge-{k}\ue001"
PLAIN_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Tokenized:
    text: str
    tokens: Tokens


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _render(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _pieces_by_markers(tokenizer, messages: list[dict], full: str) -> list[tuple[str, int]] | None:
    """Render with marker contents, split the template text around them, and check that putting
    the real contents back reproduces the real rendering exactly."""
    marked = [{**m, "content": _MARK.format(k=k)} for k, m in enumerate(messages)]
    try:
        rendered = _render(tokenizer, marked)
    except Exception:
        return None
    pieces: list[tuple[str, int]] = []
    cursor = 0
    for k, m in enumerate(messages):
        mark = _MARK.format(k=k)
        at = rendered.find(mark, cursor)
        if at < 0:
            return None
        pieces.append((rendered[cursor:at], TEMPLATE))
        kind = RESPONSE if k == len(messages) - 1 else PROMPT
        pieces.append((m["content"], kind))
        cursor = at + len(mark)
    pieces.append((rendered[cursor:], TEMPLATE))
    if "".join(p for p, _ in pieces) != full:
        return None
    return pieces


def _pieces_by_search(messages: list[dict], full: str, file: str, where: str) -> list[tuple[str, int]]:
    """Fallback for templates that transform contents (e.g. trim them): find each content in order."""
    pieces: list[tuple[str, int]] = []
    cursor = 0
    for k, m in enumerate(messages):
        content = m["content"]
        last = k == len(messages) - 1
        at = full.rfind(content) if last else full.find(content, cursor)
        if at < cursor or not content:
            content = content.strip()
            at = full.rfind(content) if last else full.find(content, cursor)
        if at < cursor or not content:
            field = "response" if last else f"messages[{k}].content"
            raise InputError(
                "the chat template changed this text beyond recognition",
                file=file,
                record=where,
                field=field,
                hint="try --no-chat-template",
            )
        pieces.append((full[cursor:at], TEMPLATE))
        pieces.append((content, RESPONSE if last else PROMPT))
        cursor = at + len(content)
    pieces.append((full[cursor:], TEMPLATE))
    return pieces


_ADDS_BOS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _adds_bos(tokenizer) -> bool:
    """Whether encoding with special tokens prepends BOS (asked once per tokenizer and BOS id)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    try:
        known = _ADDS_BOS.get(tokenizer)
    except TypeError:  # not weak-referenceable: ask every time
        known = None
    if known is not None and known[0] == bos:
        return known[1]
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    adds = len(with_special) > len(without) and with_special[0] == bos
    with contextlib.suppress(TypeError):
        _ADDS_BOS[tokenizer] = (bos, adds)
    return adds


def tokenize_pair(
    tokenizer, pair: Pair, *, chat_template: bool = True, file: str = "<data>", where: str = ""
) -> Tokenized:
    """Tokenise one pair (see module docstring)."""
    use_template = chat_template and has_chat_template(tokenizer)
    messages = list(pair.messages) + [{"role": "assistant", "content": pair.response}]
    if use_template:
        try:
            full = _render(tokenizer, messages)
        except Exception as exc:
            raise InputError(
                f"the chat template failed ({exc})", file=file, record=where, hint="try --no-chat-template"
            ) from None
        pieces = _pieces_by_markers(tokenizer, messages, full) or _pieces_by_search(messages, full, file, where)
    else:
        pieces = []
        for k, m in enumerate(pair.messages):
            if k:
                pieces.append((PLAIN_SEPARATOR, TEMPLATE))
            pieces.append((m["content"], PROMPT))
        pieces += [(PLAIN_SEPARATOR, TEMPLATE), (pair.response, RESPONSE)]

    special = set(tokenizer.all_special_ids)
    ids: list[int] = []
    kinds: list[int] = []
    offsets: list[int] = []
    text_parts: list[str] = []
    pos = 0
    if _adds_bos(tokenizer) and not (pieces and pieces[0][0].startswith(tokenizer.bos_token or "\0")):
        ids.append(tokenizer.bos_token_id)
        kinds.append(TEMPLATE)
        offsets += [0, 0]
    response_seen = False
    pieces = [(p, k) for p, k in pieces if p]
    # every piece in one call (each is encoded on its own, as one call per piece would)
    enc = tokenizer([p for p, _ in pieces], add_special_tokens=False, return_offsets_mapping=True) if pieces else None
    for n, (piece, kind) in enumerate(pieces):
        assert enc is not None
        piece_ids = enc["input_ids"][n]
        piece_offsets = enc["offset_mapping"][n]
        if response_seen:
            # Template text after the response: its first token ends the turn if it is special.
            if piece_ids and piece_ids[0] in special:
                s, e = piece_offsets[0]
                ids.append(piece_ids[0])
                kinds.append(EOS)
                offsets += [pos + s, pos + e]
                text_parts.append(piece[:e])
                pos += e
            break
        for tid, (s, e) in zip(piece_ids, piece_offsets):
            ids.append(tid)
            kinds.append(TEMPLATE if (kind == TEMPLATE or tid in special) else kind)
            offsets += [pos + s, pos + e]
        text_parts.append(piece)
        pos += len(piece)
        if kind == RESPONSE:
            response_seen = True
    if EOS not in kinds:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise InputError("the tokenizer has no EOS token to end the response", file=file, record=where)
        ids.append(eos)
        kinds.append(EOS)
        offsets += [pos, pos]
    if RESPONSE not in kinds:
        raise InputError("the response produced no tokens", file=file, record=where, field="response")
    return Tokenized(text="".join(text_parts), tokens=Tokens(input_ids=ids, kinds=bytes(kinds), offsets=offsets))
