//! Maps Hugging Face logical tensor names to llama.cpp GGUF names (`gemma3` verified on a real
//! file, Gemma 4's on llama.cpp's converter output: tests/it/gguf_converted.rs).

/// Translates a logical name (`layers.3.mlp.up_proj.weight`) to its GGUF name
/// (`blk.3.ffn_up.weight`); unknown names pass through unchanged.
pub fn gguf_name(name: &str) -> String {
    match name {
        "embed_tokens.weight" => return "token_embd.weight".into(),
        "norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        "embed_tokens_per_layer.weight" => return "per_layer_token_embd.weight".into(),
        "per_layer_model_projection.weight" => return "per_layer_model_proj.weight".into(),
        "per_layer_projection_norm.weight" => return "per_layer_proj_norm.weight".into(),
        _ => {}
    }
    let Some(rest) = name.strip_prefix("layers.") else {
        return name.to_string();
    };
    let Some((idx, tail)) = rest.split_once('.') else {
        return name.to_string();
    };
    let mapped = match tail {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "layer_scalar" => "layer_output_scale.weight",
        "per_layer_input_gate.weight" => "inp_gate.weight",
        "per_layer_projection.weight" => "proj.weight",
        "post_per_layer_input_norm.weight" => "post_norm.weight",
        "router.proj.weight" => "ffn_gate_inp.weight",
        "router.scale" => "ffn_gate_inp.scale",
        "router.per_expert_scale" => "ffn_down_exps.scale",
        "experts.gate_up_proj" => "ffn_gate_up_exps.weight",
        "experts.down_proj" => "ffn_down_exps.weight",
        "post_feedforward_layernorm_1.weight" => "post_ffw_norm_1.weight",
        "pre_feedforward_layernorm_2.weight" => "pre_ffw_norm_2.weight",
        "post_feedforward_layernorm_2.weight" => "post_ffw_norm_2.weight",
        other => return format!("blk.{idx}.{other}"),
    };
    format!("blk.{idx}.{mapped}")
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn maps_gemma3_names_seen_in_a_real_file() {
        assert_eq!(gguf_name("embed_tokens.weight"), "token_embd.weight");
        assert_eq!(
            gguf_name("layers.5.self_attn.o_proj.weight"),
            "blk.5.attn_output.weight"
        );
        assert_eq!(
            gguf_name("layers.0.pre_feedforward_layernorm.weight"),
            "blk.0.ffn_norm.weight"
        );
        assert_eq!(
            gguf_name("layers.17.post_feedforward_layernorm.weight"),
            "blk.17.post_ffw_norm.weight"
        );
    }
}
