#!/usr/bin/env python3
"""Writes a synthetic Gemma 4 E2B vision tower for `kvlab bench image`: the E2B/E4B tower's
shape (transformers' Gemma4VisionConfig defaults: 16 layers, hidden 768, 12 heads of 64,
MLP 3072, patch 16, 3x3 pooling, a 10,240-entry position table, clipped linears) and the
projector into E2B's 1536-wide text, with random bf16 weights, in `model.safetensors`
beside a config.json that carries the real E2B text config (from make_synthetic_e2b.py),
so the bench prints the KV bytes an image costs at that shape. About 340 MB.

    python make_synthetic_e2b_vision.py OUT_DIR

Fixed seed. Needs numpy only.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_synthetic_e2b import CONFIG, HIDDEN, bf16, write_tensor  # noqa: E402

V, FF, LAYERS, HEADS, HEAD_DIM, PATCH, POSITIONS = 768, 3072, 16, 12, 64, 16, 10240

VISION_CONFIG = {
    "model_type": "gemma4_vision",
    "hidden_size": V,
    "intermediate_size": FF,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "head_dim": HEAD_DIM,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "patch_size": PATCH,
    "pooling_kernel_size": 3,
    "position_embedding_size": POSITIONS,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    "standardize": False,
    "use_clipped_linears": True,
}


def shapes():
    t = "model.vision_tower."
    yield f"{t}patch_embedder.input_proj.weight", (V, 3 * PATCH * PATCH), "linear"
    yield f"{t}patch_embedder.position_embedding_table", (2, POSITIONS, V), "embed"
    for i in range(LAYERS):
        p = f"{t}encoder.layers.{i}."
        for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"]:
            yield f"{p}{n}.weight", (V,), "norm"
        for n in ["q_norm", "k_norm"]:
            yield f"{p}self_attn.{n}.weight", (HEAD_DIM,), "norm"
        linears = [("self_attn.q_proj", (V, V)), ("self_attn.k_proj", (V, V)),
                   ("self_attn.v_proj", (V, V)), ("self_attn.o_proj", (V, V)),
                   ("mlp.gate_proj", (FF, V)), ("mlp.up_proj", (FF, V)), ("mlp.down_proj", (V, FF))]
        for n, s in linears:
            yield f"{p}{n}.linear.weight", s, "linear"
            for c in ["input_min", "input_max", "output_min", "output_max"]:
                yield f"{p}{n}.{c}", (), c
    yield "model.embed_vision.embedding_projection.weight", (HIDDEN, V), "linear"


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261206)
    tensors = list(shapes())
    header, at = {}, 0
    for name, shape, _ in tensors:
        b = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + b]}
        at += b
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for _, shape, kind in tensors:
            if kind.endswith("_min") or kind.endswith("_max"):
                # Clip bounds wide enough never to bite on random weights.
                f.write(bf16(np.array([-1e4 if kind.endswith("_min") else 1e4], np.float32)).tobytes())
            else:
                write_tensor(f, rng, shape, kind)
    config = dict(CONFIG)
    config.update({"vision_config": VISION_CONFIG, "boi_token_id": 255999,
                   "image_token_id": 258880, "eoi_token_id": 258882})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    print(f"wrote {out / 'model.safetensors'} ({at / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
