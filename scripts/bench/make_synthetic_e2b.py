#!/usr/bin/env python3
"""Writes a synthetic Gemma 4 E2B checkpoint for `kvlab bench load`: the real E2B text config
(35 layers, hidden 1536, vocab 262144, per-layer embeddings 35 x 256, KV sharing over the last
20 layers, double-wide MLPs there) with random bf16 weights, as sharded safetensors under the
multimodal prefix `model.language_model.` (as google/gemma-4-E2B-it ships it), plus a small
vision tensor that a text loader must never read. About 9.3 GB.

    python make_synthetic_e2b.py OUT_DIR [--tokenizer tokenizer.json]

Fixed seed, so two runs write the same bytes. Needs numpy only.
"""
import argparse
import json
from pathlib import Path

import numpy as np

HIDDEN, LAYERS, VOCAB, PLE = 1536, 35, 262144, 256
HEADS, KV_HEADS, HEAD_DIM, GLOBAL_HEAD_DIM = 8, 1, 256, 512
FF, SHARED = 6144, 20
TYPES = ["sliding_attention"] * 4 + ["full_attention"]
LAYER_TYPES = TYPES * 7
PREFIX = "model.language_model."
SHARD_BYTES = 2 << 30

CONFIG = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size": HIDDEN,
        "hidden_size_per_layer_input": PLE,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_global_key_value_heads": None,
        "head_dim": HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM,
        "attention_k_eq_v": False,
        "num_kv_shared_layers": SHARED,
        "use_double_wide_mlp": True,
        "enable_moe_block": False,
        # Present (as null) in the released config; llama.cpp's converter requires the keys.
        "num_experts": None,
        "top_k_experts": None,
        "moe_intermediate_size": None,
        "layer_types": LAYER_TYPES,
        "sliding_window": 512,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    },
    "tie_word_embeddings": True,
}

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
    "add_bos_token": True, "add_eos_token": False,
}


def shapes():
    """(name, shape, kind) of every text tensor; kind picks the random distribution."""
    yield "embed_tokens.weight", (VOCAB, HIDDEN), "embed"
    yield "embed_tokens_per_layer.weight", (VOCAB, LAYERS * PLE), "embed"
    yield "per_layer_model_projection.weight", (LAYERS * PLE, HIDDEN), "linear"
    yield "per_layer_projection_norm.weight", (PLE,), "norm"
    yield "norm.weight", (HIDDEN,), "norm"
    first_shared = LAYERS - SHARED
    for i, t in enumerate(LAYER_TYPES):
        p = f"layers.{i}."
        hd = GLOBAL_HEAD_DIM if t == "full_attention" else HEAD_DIM
        ff = FF * 2 if i >= first_shared else FF
        for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "post_per_layer_input_norm"]:
            yield f"{p}{n}.weight", (HIDDEN,), "norm"
        yield f"{p}self_attn.q_proj.weight", (HEADS * hd, HIDDEN), "linear"
        yield f"{p}self_attn.q_norm.weight", (hd,), "norm"
        if i < first_shared:
            yield f"{p}self_attn.k_proj.weight", (KV_HEADS * hd, HIDDEN), "linear"
            yield f"{p}self_attn.v_proj.weight", (KV_HEADS * hd, HIDDEN), "linear"
            yield f"{p}self_attn.k_norm.weight", (hd,), "norm"
        yield f"{p}self_attn.o_proj.weight", (HIDDEN, HEADS * hd), "linear"
        yield f"{p}mlp.gate_proj.weight", (ff, HIDDEN), "linear"
        yield f"{p}mlp.up_proj.weight", (ff, HIDDEN), "linear"
        yield f"{p}mlp.down_proj.weight", (HIDDEN, ff), "linear"
        yield f"{p}per_layer_input_gate.weight", (PLE, HIDDEN), "linear"
        yield f"{p}per_layer_projection.weight", (HIDDEN, PLE), "linear"
        yield f"{p}layer_scalar", (1,), "scalar"


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def write_tensor(f, rng, shape, kind):
    """Writes one tensor's random bf16 values, in slices so no large temporary is built."""
    n = int(np.prod(shape))
    if kind == "norm":
        f.write(bf16(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).tobytes())
        return
    if kind == "scalar":
        f.write(bf16(np.full(n, 0.5, dtype=np.float32)).tobytes())
        return
    std = 0.02 if kind == "embed" else 1.0 / np.sqrt(shape[-1])
    step = 1 << 25
    for at in range(0, n, step):
        m = min(step, n - at)
        f.write(bf16(std * rng.standard_normal(m, dtype=np.float32)).tobytes())


def plan():
    """Tensors grouped into shards of about SHARD_BYTES, in order."""
    tensors = [(PREFIX + n, s, k) for n, s, k in shapes()]
    # A vision tower tensor: never read by a text model (the loader must skip it).
    tensors.append(("model.vision_tower.patch_embedder.weight", (768, 768), "linear"))
    shards, cur, size = [], [], 0
    for t in tensors:
        b = int(np.prod(t[1])) * 2
        if cur and size + b > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += b
    shards.append(cur)
    return shards


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer.json to copy beside the weights")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20260401)
    shards = plan()
    weight_map = {}
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, at = {}, 0
        for t, shape, _ in tensors:
            b = int(np.prod(shape)) * 2
            header[t] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + b]}
            at += b
            weight_map[t] = name
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(args.out / name, "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for _, shape, kind in tensors:
                write_tensor(f, rng, shape, kind)
        print(f"wrote {name} ({at / 2**30:.2f} GiB)", flush=True)
    index = {"metadata": {}, "weight_map": weight_map}
    (args.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (args.out / "config.json").write_text(json.dumps(CONFIG, indent=1))
    if args.tokenizer:
        # Gemma 3's tokenizer.json adds <image_soft_token> at id 262144, past the 262144-row
        # embedding; llama.cpp rejects a vocabulary larger than the embedding, so it is
        # dropped (Gemma 4's own tokenizer has exactly 262144 ids).
        tok = json.loads(args.tokenizer.read_text(encoding="utf-8"))
        tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < VOCAB]
        (args.out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
        # Lets llama.cpp's converter (transformers' AutoTokenizer) read tokenizer.json without
        # a transformers release that knows `gemma4`.
        (args.out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=1))


if __name__ == "__main__":
    main()
