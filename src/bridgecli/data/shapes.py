"""Recognise the shape of a raw record and turn it into prompt messages + one response.

Shapes, tried in this order (``--prompt-field/--response-field`` override them):

- chat: ``messages`` (or ``conversations``) as a list of ``{role, content}`` (ShareGPT
  ``{from, value}`` is accepted too); the last assistant turn is the response, every turn before
  it is the prompt.
- prompt/response: ``prompt`` + ``response`` | ``completion`` | ``output`` | ``chosen``; a prompt or
  completion may itself be a list of messages (TRL's conversational prompt/completion format).
- Alpaca: ``instruction`` (+ optional ``input``) + ``output``.
- GSM8K: ``question`` + ``answer``.
- MATH: ``problem`` + ``solution``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Pair:
    """One training example: the prompt as chat messages, and the response text."""

    id: str
    messages: tuple[dict, ...]  # prompt turns, each {"role", "content"}
    response: str
    shape: str


def _text(value: Any, where: str, field: str, file: str) -> str:
    if isinstance(value, str):
        return value
    raise InputError(f"expected a string, got {type(value).__name__}", file=file, record=where, field=field)


def _messages(value: Any, where: str, field: str, file: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InputError("expected a non-empty list of messages", file=file, record=where, field=field)
    out = []
    for k, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise InputError("a message must be an object", file=file, record=where, field=f"{field}[{k}]")
        role = msg.get("role", msg.get("from"))
        content = msg.get("content", msg.get("value"))
        if not isinstance(role, str) or role.lower() not in ROLE_ALIASES:
            raise InputError(f"unknown role {role!r}", file=file, record=where, field=f"{field}[{k}].role")
        if not isinstance(content, str):
            raise InputError("message content must be a string", file=file, record=where, field=f"{field}[{k}].content")
        out.append({"role": ROLE_ALIASES[role.lower()], "content": content})
    return out


def _from_chat(rec: dict, key: str, where: str, file: str) -> tuple[list[dict], str]:
    msgs = _messages(rec[key], where, key, file)
    if msgs[-1]["role"] != "assistant":
        raise InputError(
            "the last message must be the assistant's response",
            file=file,
            record=where,
            field=f"{key}[{len(msgs) - 1}].role",
        )
    if len(msgs) < 2:
        raise InputError("needs at least one prompt message before the response", file=file, record=where, field=key)
    return msgs[:-1], msgs[-1]["content"]


RESPONSE_KEYS = ("response", "completion", "output", "chosen")


#: the record shapes :func:`to_pair` recognises, for a record of none of them
SHAPES = (
    "expected prompt/response, messages (chat), instruction/input/output (Alpaca), question/answer (GSM8K) "
    "or problem/solution (MATH)"
)


def to_pair(
    rec: dict,
    index: int,
    where: str,
    file: str,
    *,
    prompt_field: str | None = None,
    response_field: str | None = None,
    id_field: str = "id",
    hint: str | None = None,
) -> Pair:
    """Normalise one record; raise :class:`InputError` naming the file, record and field. ``hint``: how
    the command names the fields of a record of no known shape (default: the shapes it knows)."""
    rid = rec.get(id_field)
    rid = str(rid) if isinstance(rid, (str, int)) and str(rid) else str(index)
    if prompt_field or response_field:
        pf = prompt_field or "prompt"
        rf = response_field or "response"
        for f in (pf, rf):
            if f not in rec:
                raise InputError("missing field", file=file, record=where, field=f)
        prompt = _messages(rec[pf], where, pf, file)
        resp = rec[rf]
        if isinstance(resp, list):
            resp = _messages(resp, where, rf, file)[-1]["content"]
        return _check(Pair(rid, tuple(prompt), _text(resp, where, rf, file), "fields"), where, file, rf)
    for key in ("messages", "conversations"):
        if key in rec:
            prompt, resp = _from_chat(rec, key, where, file)
            return _check(Pair(rid, tuple(prompt), resp, "chat"), where, file, key)
    if "prompt" in rec:
        for rk in RESPONSE_KEYS:
            if rk in rec:
                prompt = _messages(rec["prompt"], where, "prompt", file)
                resp = rec[rk]
                if isinstance(resp, list):
                    resp = _messages(resp, where, rk, file)[-1]["content"]
                return _check(
                    Pair(rid, tuple(prompt), _text(resp, where, rk, file), "prompt-response"), where, file, rk
                )
    if "instruction" in rec and "output" in rec:
        instr = _text(rec["instruction"], where, "instruction", file)
        extra = rec.get("input") or ""
        extra = _text(extra, where, "input", file)
        user = instr if not extra.strip() else f"{instr}\n\n{extra}"
        return _check(
            Pair(rid, ({"role": "user", "content": user},), _text(rec["output"], where, "output", file), "alpaca"),
            where,
            file,
            "output",
        )
    for pk, rk, shape in (("question", "answer", "gsm8k"), ("problem", "solution", "math")):
        if pk in rec and rk in rec:
            return _check(
                Pair(
                    rid,
                    ({"role": "user", "content": _text(rec[pk], where, pk, file)},),
                    _text(rec[rk], where, rk, file),
                    shape,
                ),
                where,
                file,
                rk,
            )
    keys = ", ".join(sorted(rec)[:8])
    raise InputError(
        f"cannot tell the prompt from the response (fields: {keys})",
        file=file,
        record=where,
        hint=hint or SHAPES,
    )


def _check(pair: Pair, where: str, file: str, field: str) -> Pair:
    if not pair.response.strip():
        raise InputError("the response is empty", file=file, record=where, field=field)
    return pair
