"""``bridge reference``: per-token losses (and attention, gradient norms) of one more model, stored in
every example under a name, for the compared methods (docs/compared-methods.md).

One model is in memory at a time: run the step once per model (the base model theta_old, a
reference model, the warmup checkpoint). The model's tokenizer must be the stream's (checked by
fingerprint), since the stored token ids are fed to it as they are.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from ..artifacts.warmup_run import WarmupRun
from ..errors import ModelError, UsageError
from ..format.reader import open_reader
from ..format.records import Array, Example, Header, Reference
from ..modeling.loading import (
    fingerprint,
    load_model,
    load_tokenizer,
    resolve,
    resolve_device,
    tokenizer_fingerprint,
)
from ..optionspec import recorded
from ..progress import note, progress_bar
from ..runtime.stream_output import StreamOutput
from .common import next_header, step_record
from .options import ReferenceOptions

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def resolve_reference(model: str | None, header: Header) -> tuple[str, str]:
    """(what to load, default name): the stream's base model (``base``), a warmup run folder's
    checkpoint (``warmup``), or any other local path / HF id (``ref``)."""
    if model is None:
        return header.model.source, "base"
    p = Path(model).expanduser()
    if WarmupRun.is_run(p):
        return str(WarmupRun(p).checkpoint), "warmup"
    return model, "ref"


def check_tokenizer(tokenizer, header: Header, source: str, mode: str) -> None:
    want = header.model.tokenizer_fingerprint
    got = tokenizer_fingerprint(tokenizer)
    if got == want:
        return
    if mode == "vocab":
        try:
            stream_tok = load_tokenizer(header.model.source)
        except ModelError as err:
            raise ModelError(
                f"--tokenizer-check vocab needs the stream's tokenizer ({header.model.source}): {err.message}"
            ) from None
        same = (
            stream_tok.get_vocab() == tokenizer.get_vocab() and stream_tok.all_special_ids == tokenizer.all_special_ids
        )
        if same:
            note(f"reference tokenizer differs from the stream's ({got} vs {want}) but the vocabularies are identical")
            return
        raise ModelError(
            f"the tokenizer of {source} has a different vocabulary from the stream's "
            f"({header.model.source}): its per-token losses would be computed on the wrong tokens",
            hint="use a reference model with the same tokenizer",
        )
    raise ModelError(
        f"the tokenizer of {source} is not the stream's ({got} vs {want}, from {header.model.source}): "
        "the stored token ids would be fed to a different tokenizer's model",
        hint="use a reference model with the same tokenizer; --tokenizer-check vocab accepts one whose vocabulary "
        "is identical and only the chat template or special-token map differ",
    )


def run_reference(opts: ReferenceOptions) -> int:
    output = StreamOutput(opts.out, inputs=(opts.inp,))  # its checks before anything loads
    from ..runtime.params import check, check_device

    check(opts)
    check_device(opts.device)
    if opts.name is not None and (opts.name == "scores" or not _NAME.match(opts.name)):
        raise UsageError(
            f"--as {opts.name!r}: use letters, digits and _.+- ('scores' is reserved for the "
            "losses `bridge score` stores)"
        )
    with open_reader(opts.inp) as reader:
        header = reader.header
        spec, default_name = resolve_reference(opts.model, header)
        name = opts.name or default_name
        device = resolve_device(opts.device)
        tokenizer = load_tokenizer(spec)
        check_tokenizer(tokenizer, header, spec, opts.tokenizer_check)
        model_fp = fingerprint(resolve(spec))
        note(f"reference '{name}': {spec} on {device}")
        import torch

        model = load_model(spec, dtype=getattr(torch, opts.dtype), device=device).eval()
        vocab = model.get_input_embeddings().weight.shape[0]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        from ..baselines.reference import reference_batch

        params = recorded(
            opts,
            name=name,
            model=spec,
            device=device,
            fingerprint=model_fp,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        )
        out_header = next_header(header, header.stage, step_record("reference", params))
        replaced = 0
        with output.writing(out_header) as writer, progress_bar() as bar:
            assert writer is not None  # a plain output: always a writer
            task = bar.add_task(f"reference {name}", total=None, unit="ex")
            pending: list[Example] = []

            def flush():
                nonlocal replaced
                stats = reference_batch(
                    model, pending, pad_id=pad_id, device=device, attention=opts.attention, grad_norms=opts.grad_norms
                )
                for ex, st in zip(pending, stats):
                    ref = Reference(model=spec, fingerprint=model_fp, **{k: Array.of(v) for k, v in st.items()})
                    replaced += name in ex.references
                    writer.write(msgspec.structs.replace(ex, references={**ex.references, name: ref}))
                writer.flush()
                bar.update(task, advance=len(pending))
                pending.clear()

            for ex in reader:
                if ex.tokens.input_ids and max(ex.tokens.input_ids) >= vocab:
                    raise ModelError(
                        f"token id {max(ex.tokens.input_ids)} is outside the vocabulary of {spec} ({vocab} rows)",
                        file=reader.name,
                        record=ex.index,
                    )
                pending.append(ex)
                if len(pending) >= opts.batch_size:
                    flush()
            if pending:
                flush()
            written = writer.count
    if replaced:
        note(f"replaced an earlier reference named '{name}' in {replaced} examples")
    note(f"stored '{name}' per-token losses for {written} examples")
    return written
