"""03's beam search on CTranslate2 (``--engine ctranslate2``): a Pegasus checkpoint converted once into
CTranslate2's format and kept beside the model, keyed by the checkpoint's digest.

CTranslate2's own converter does not read Pegasus under transformers 5 (it asks for ``normalize_before``
and then for an embedding layer norm that Pegasus has none of), so the model's spec is filled here
directly from the weights: pre-norm layers, sinusoidal positions (the table the model itself uses),
scaled embeddings, no embedding layer norm, a final layer norm in the encoder and the decoder, and the
output projection with ``final_logits_bias``. The vocabulary is the model's ids written as ``t0 t1 ...``:
the text is tokenised and detokenised by the model's own tokenizer, as on the transformers path, so
both engines see the same ids.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "config.json")


def available(device: str) -> str | None:
    """Why CTranslate2 cannot run on ``device`` here, or None when it can."""
    try:
        import ctranslate2
    except ImportError:
        return "the ctranslate2 package is not installed"
    from clid.run import runtime

    if runtime.device_plan(device).gpu:
        if ctranslate2.get_cuda_device_count() == 0:
            return "ctranslate2 sees no GPU (its wheel needs a CUDA 12 driver or newer)"
        for lib in ("libcublas.so.12", "libcublasLt.so.12"):
            try:
                ctypes.CDLL(lib)
            except OSError:
                return f"ctranslate2's CUDA build needs {lib} (CUDA 12's cuBLAS), which is not on the library path"
    return None


def model_folder(name: str) -> Path:
    """The folder of a model given as a folder or a hub name (in the hub cache)."""
    if Path(name).is_dir():
        return Path(name)
    from transformers.utils import cached_file

    return Path(cached_file(name, "config.json", local_files_only=True)).parent


def checkpoint_digest(folder: Path) -> str:
    """SHA-256 over the checkpoint's weight files and config (their names and bytes)."""
    digest = hashlib.sha256()
    for name in WEIGHT_FILES:
        path = folder / name
        if path.exists():
            digest.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def token(i: int) -> str:
    return f"t{i}"


def model_spec(model):
    """CTranslate2's TransformerSpec filled from a transformers PegasusForConditionalGeneration."""
    import numpy as np
    from ctranslate2.specs import common_spec, transformer_spec

    activations = {"gelu": common_spec.Activation.GELU, "gelu_python": common_spec.Activation.GELU,
                   "gelu_new": common_spec.Activation.GELUTanh, "gelu_pytorch_tanh": common_spec.Activation.GELUTanh,
                   "relu": common_spec.Activation.RELU, "silu": common_spec.Activation.SWISH,
                   "swish": common_spec.Activation.SWISH}
    config = model.config
    if config.activation_function not in activations:
        raise ValueError(f"activation {config.activation_function!r} has no CTranslate2 equivalent")
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers), config.encoder_attention_heads, pre_norm=True,
        activation=activations[config.activation_function], layernorm_embedding=False)

    def array(t):
        return np.ascontiguousarray(t.detach().float().cpu().numpy())

    def linear(target, *modules):  # one or several linears fused along the output dimension
        target.weight = np.concatenate([array(m.weight) for m in modules])
        target.bias = np.concatenate([array(m.bias) for m in modules])

    def norm(target, module):
        target.gamma, target.beta = array(module.weight), array(module.bias)

    def common(target, stack):
        target.scale_embeddings = float(stack.embed_scale)
        target.position_encodings.encodings = array(stack.embed_positions.weight)
        (target.embeddings[0] if isinstance(target.embeddings, list) else target.embeddings).weight = \
            array(stack.embed_tokens.weight)
        norm(target.layer_norm, stack.layer_norm)

    def ffn(target, layer):
        linear(target.linear_0, layer.fc1)
        linear(target.linear_1, layer.fc2)
        norm(target.layer_norm, layer.final_layer_norm)

    encoder, decoder = model.model.encoder, model.model.decoder
    common(spec.encoder, encoder)
    for target, layer in zip(spec.encoder.layer, encoder.layers):
        attention = layer.self_attn
        linear(target.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        linear(target.self_attention.linear[1], attention.out_proj)
        norm(target.self_attention.layer_norm, layer.self_attn_layer_norm)
        ffn(target.ffn, layer)
    common(spec.decoder, decoder)
    for target, layer in zip(spec.decoder.layer, decoder.layers):
        attention, cross = layer.self_attn, layer.encoder_attn
        linear(target.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        linear(target.self_attention.linear[1], attention.out_proj)
        norm(target.self_attention.layer_norm, layer.self_attn_layer_norm)
        linear(target.attention.linear[0], cross.q_proj)
        linear(target.attention.linear[1], cross.k_proj, cross.v_proj)
        linear(target.attention.linear[2], cross.out_proj)
        norm(target.attention.layer_norm, layer.encoder_attn_layer_norm)
        ffn(target.ffn, layer)
    spec.decoder.projection.weight = array(model.lm_head.weight)
    bias = getattr(model, "final_logits_bias", None)
    if bias is not None:
        spec.decoder.projection.bias = array(bias.reshape(-1))

    vocabulary = [token(i) for i in range(config.vocab_size)]
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.bos_token = token(config.pad_token_id)
    spec.config.eos_token = token(config.eos_token_id)
    spec.config.unk_token = token(getattr(config, "unk_token_id", None) or 2)  # (Pegasus: id 2 is <mask_1>/unk)
    spec.config.decoder_start_token = token(config.decoder_start_token_id)
    return spec


def converted(name: str, load_model, again: str | None = None) -> Path:
    """The CTranslate2 copy of the checkpoint ``name``, converted now if it is not there yet: a folder
    ``ctranslate2-DIGEST`` beside the model, written under a temporary name and renamed when whole
    (a killed conversion leaves only its temporary folder, which the next run replaces).
    ``load_model()`` gives the transformers model (on the CPU) when a conversion is needed. ``again``: why the
    converted copy there is converted again (CTranslate2 could not load it)."""
    folder = model_folder(name)
    target = folder / f"ctranslate2-{checkpoint_digest(folder)[:16]}"
    if (target / "model.bin").exists():
        problem = again or conversion_problem(target)
        if problem is None:
            return target
        print(f"warning: {target}: {problem}; converting the checkpoint again", file=sys.stderr)
    partial = folder / f".{target.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    spec = model_spec(load_model())
    spec.validate()
    spec.optimize(quantization=None)
    partial.mkdir()
    spec.save(str(partial))
    sizes = {p.name: p.stat().st_size for p in partial.iterdir() if p.is_file()}
    (partial / WRITTEN).write_text(json.dumps(sizes, indent=1, sort_keys=True) + "\n")
    if target.exists():  # (only a conversion of ours, found damaged above, is replaced)
        shutil.rmtree(target)
    os.replace(partial, target)
    return target


WRITTEN = "clid-written.json"  # in a converted folder: each file's size as the conversion wrote it


def conversion_problem(target: Path) -> str | None:
    """Why the converted folder ``target`` is not whole (a file cut short or changed since its conversion
    wrote it), or None. A folder converted before the sizes were recorded is taken as it is."""
    try:
        sizes = json.loads((target / WRITTEN).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return f"its record {WRITTEN} does not read"
    for file_name, size in sizes.items():
        path = target / file_name
        if not path.is_file():
            return f"{file_name} of its conversion is missing"
        if path.stat().st_size != size:
            return f"{file_name} is {path.stat().st_size} bytes, not the {size} its conversion wrote (cut short or changed)"
    return None


class Translator:
    """Beam search over token ids with a converted Pegasus."""

    def __init__(self, path: Path, device: str, precision: str, threads: int):
        import ctranslate2

        from clid.run import runtime

        plan = runtime.device_plan(device, precision)
        compute = {"bf16": "bfloat16", "fp32": "float32"}[plan.compute] if plan.gpu else "float32"
        self.translator = ctranslate2.Translator(str(path), device=plan.type, device_index=plan.device.index or 0,
                                                 compute_type=compute, intra_threads=threads)

    def generate(self, batch_ids: list[list[int]], num_beams: int, max_length: int, generation_config,
                 batch_size: int) -> list[list[int]]:
        """The best beam's ids for each input (ids as the tokenizer gave them, its final </s> included).
        ``max_length`` counts the decoder's start token, as transformers' ``max_length`` does, and a forced
        final </s> (Pegasus's ``forced_eos_token_id``), which CTranslate2 does not add."""
        g = generation_config
        forced_end = 1 if getattr(g, "forced_eos_token_id", None) is not None else 0
        results = self.translator.translate_batch(
            [[token(i) for i in ids] for ids in batch_ids], beam_size=num_beams, max_batch_size=batch_size,
            max_decoding_length=max_length - 1 - forced_end, min_decoding_length=max(0, (g.min_length or 0) - 1),
            length_penalty=g.length_penalty if g.length_penalty is not None else 1.0,
            repetition_penalty=g.repetition_penalty or 1.0, no_repeat_ngram_size=g.no_repeat_ngram_size or 0)
        return [[int(t[1:]) for t in r.hypotheses[0]] for r in results]
