//! The SPEC grammar's checks: every form parses, prints canonically and round-trips, and
//! malformed SPECs are refused with the reason.

use super::*;

fn tq(bits: Bits) -> SideSpec {
    SideSpec::Codes(Spec::mse(bits))
}

/// A key side as parsed by default: mse with the unbiased scale.
fn tk(bits: Bits) -> SideSpec {
    SideSpec::Codes(Spec {
        unbiased: true,
        ..Spec::mse(bits)
    })
}

#[test]
fn parses_the_documented_examples() -> Result<()> {
    assert_eq!(CacheSpec::parse("f16")?, CacheSpec::Dense(KvPrecision::F16));
    assert_eq!(
        CacheSpec::parse(" BF16 ")?,
        CacheSpec::Dense(KvPrecision::BF16)
    );
    assert_eq!(
        CacheSpec::parse("tq3.5@all")?,
        CacheSpec::Split {
            precision: LayerPrecision::new(tk(Bits::B3_5), tq(Bits::B3_5)),
            scope: LayerScope::All
        }
    );
    assert_eq!(
        CacheSpec::parse("k4v3")?,
        CacheSpec::Split {
            precision: LayerPrecision::new(tk(Bits::B4), tq(Bits::B3)),
            scope: LayerScope::Full
        }
    );
    assert_eq!(
        CacheSpec::parse("k4vf16@sliding")?,
        CacheSpec::Split {
            precision: LayerPrecision::new(tk(Bits::B4), SideSpec::F16),
            scope: LayerScope::Sliding
        }
    );
    let CacheSpec::Split { precision, .. } = CacheSpec::parse("tq3@all+haar+nc+s9")? else {
        panic!("not turboquant");
    };
    let s = precision.key.spec().copied();
    assert_eq!(
        s,
        Some(Spec {
            bits: Bits::B3,
            variant: Variant::Mse,
            rotation: RotationKind::Haar,
            norm_correction: true,
            unbiased: false,
            seed: 9
        })
    );
    let CacheSpec::Split { precision, .. } = CacheSpec::parse("tq4+prod")? else {
        panic!("not turboquant");
    };
    assert_eq!(
        precision.value.spec().map(|s| s.variant),
        Some(Variant::Prod)
    );
    Ok(())
}

#[test]
fn a_spec_past_its_length_is_refused_with_a_short_echo() {
    assert!(CacheSpec::parse("tq3.5@sliding+haar+nc+s4294967295").is_ok());
    let long = format!("tq4{}", "+nc".repeat(1_000_000));
    let e = CacheSpec::parse(&long).unwrap_err().to_string();
    assert!(e.contains("at most 64"), "{e}");
    assert!(e.len() < 200, "{} bytes of error", e.len());
}

#[test]
fn display_round_trips_in_canonical_form() -> Result<()> {
    for (input, canonical) in [
        ("f16", "f16"),
        ("f32", "f32"),
        ("bf16", "bf16"),
        ("f32@all", "f32"),
        ("f16@full", "f16"),
        ("f32@full", "f32@full"),
        ("BF16@sliding", "bf16@sliding"),
        ("tq4", "tq4"),
        ("tq4@full", "tq4"),
        ("TQ3.5@ALL", "tq3.5@all"),
        ("tq2.5", "tq2.5"),
        ("tq2@sliding", "tq2@sliding"),
        ("k4v4", "tq4"),
        ("k3.5v2.5", "k3.5v2.5"),
        ("k4vf16", "k4vf16"),
        ("kf16v3", "kf16v3"),
        ("k8v4@all", "k8v4@all"),
        ("k5v5", "tq5"),
        ("k6vf16", "k6vf16"),
        ("k5v4.5+qw@all", "k5v4.5+qw@all"),
        ("tq4+prod", "tq4+prod"),
        ("tq3+mse+hadamard+seed=0", "tq3"),
        ("tq3@all+seed=12+nc+haar", "tq3+nc+haar+seed=12@all"),
        ("tq4+nocenter", "tq4+nocenter"),
        ("tq3.5@all+qw", "tq3.5+qw@all"),
        ("k4v3+qw+nocenter", "k4v3+nocenter+qw"),
        ("tq4@all+nocenter+ub", "tq4+ub+nocenter@all"),
        ("tq4+plain", "tq4+plain"),
        ("kf16v3+ub", "kf16v3+ub"),
        ("kf16v3+plain", "kf16v3"),
        ("k4vf16+plain", "k4vf16+plain"),
        ("k4vf16+ub", "k4vf16"),
        ("tq3+prod+plain", "tq3+prod"),
    ] {
        let s = CacheSpec::parse(input)?;
        assert_eq!(s.to_string(), canonical, "{input}");
        assert_eq!(CacheSpec::parse(&s.to_string())?, s, "{input}");
        let json = serde_json::to_string(&s).map_err(|e| EngineError::invalid(e.to_string()))?;
        assert_eq!(json, format!("\"{canonical}\""));
        let back: CacheSpec =
            serde_json::from_str(&json).map_err(|e| EngineError::invalid(e.to_string()))?;
        assert_eq!(back, s);
    }
    Ok(())
}

#[test]
fn llama_cpp_types_take_the_key_value_form() -> Result<()> {
    use BlockType::*;
    let pair = |s: &str| -> Result<(LayerPrecision, LayerScope)> {
        match CacheSpec::parse(s)? {
            CacheSpec::Split { precision, scope } => Ok((precision, scope)),
            other => Err(EngineError::invalid(format!("{other} is dense"))),
        }
    };
    let (p, scope) = pair("q8_0")?;
    assert_eq!(
        (p.key, p.value),
        (SideSpec::Blocks(Q8_0), SideSpec::Blocks(Q8_0))
    );
    // As -ctk/-ctv: every layer unless scoped, rotated unless told not to.
    assert_eq!(scope, LayerScope::All);
    assert!(p.rotate);
    let (p, _) = pair("Q8_0/q4_0")?;
    assert_eq!(
        (p.key, p.value),
        (SideSpec::Blocks(Q8_0), SideSpec::Blocks(Q4_0))
    );
    let (p, _) = pair("f16/iq4_nl+norot")?;
    assert_eq!(
        (p.key, p.value, p.rotate),
        (SideSpec::F16, SideSpec::Blocks(Iq4Nl), false)
    );
    let (p, scope) = pair("q8_0/tq3@full")?;
    assert_eq!(p.key, SideSpec::Blocks(Q8_0));
    assert_eq!(p.value, tq(Bits::B3));
    assert_eq!(scope, LayerScope::Full);
    // Dense pairs cover every layer as llama.cpp's types do; a TurboQuant side keeps
    // TurboQuant's full-attention default.
    let (p, scope) = pair("f32/bf16")?;
    assert_eq!(
        (p.key, p.value, scope),
        (SideSpec::F32, SideSpec::BF16, LayerScope::All)
    );
    let (p, scope) = pair("bf16/tq3")?;
    assert_eq!((p.key, scope), (SideSpec::BF16, LayerScope::Full));
    let (p, _) = pair("tq4/q4_1+qw+nc")?;
    assert!(p.weigh_keys);
    assert_eq!(p.key.spec().map(|s| s.norm_correction), Some(true));
    for (input, canonical) in [
        ("q8_0", "q8_0"),
        ("q8_0/q8_0@all", "q8_0"),
        ("q4_0@full", "q4_0@full"),
        ("q8_0/q4_0", "q8_0/q4_0"),
        ("q4_0+norot", "q4_0+norot"),
        ("q4_0+sink", "q4_0+sink"),
        ("q8_0/q4_0+sink+norot@all", "q8_0/q4_0+norot+sink"),
        ("q5_1/f16@sliding+norot", "q5_1/f16+norot@sliding"),
        ("f16/q4_0", "f16/q4_0"),
        ("q8_0/tq3", "q8_0/tq3"),
        ("tq3.5/q5_0+qw", "tq3.5/q5_0+qw"),
        // TurboQuant sides keep their first token too.
        ("tq3+sink", "tq3+sink"),
        ("k4v3+sink+qw@all", "k4v3+qw+sink@all"),
        ("f16/tq3+sink@all", "kf16v3+sink@all"),
        // Without a llama.cpp side, the slash form is TurboQuant's.
        ("tq4/tq3", "k4v3"),
        ("f16/tq3@all", "kf16v3@all"),
        // Any two formats of the registry, dense ones included (as -ctk/-ctv take them).
        ("f32/q4_0", "f32/q4_0"),
        ("q8_0/bf16@full", "q8_0/bf16@full"),
        ("tq4/f32+qw", "tq4/f32+qw"),
        ("bf16/tq3@all", "bf16/tq3@all"),
        ("F32/BF16", "f32/bf16"),
        ("bf16/f16@sliding", "bf16/f16@sliding"),
    ] {
        let s = CacheSpec::parse(input)?;
        assert_eq!(s.to_string(), canonical, "{input}");
        assert_eq!(CacheSpec::parse(canonical)?, s, "{input}");
    }
    for bad in [
        "q8_0+nc",
        "q4_0+qw",
        "f16/q4_0+nocenter",
        "tq4+norot",
        "q4_0+norot+norot",
        "f32/bf16+sink",
        "f16+sink",
        "tq3+sink+sink",
        "q4_0+sink+sink",
        "q9_0",
        "f16/f16",
        "f32/f32",
        "bf16/bf16@all",
        "f32/bf16+nocenter",
        "f32/bf16+norot",
        "q8_0/",
        "/q4_0",
        "q8_0/q4_0/q4_0",
        "tqf16/q4_0",
        "q4_k",
    ] {
        assert!(CacheSpec::parse(bad).is_err(), "{bad:?} should be rejected");
    }
    Ok(())
}

#[test]
fn rejects_malformed_and_unsupported_specs() {
    for s in [
        "",
        "f8",
        "tq",
        "tq9",
        "tq6.5",
        "k8.5v4",
        "tq 4",
        "tqf16",
        "kf16vf16",
        "k4",
        "k4x3",
        "v3",
        "f16+nc",
        "f32@half",
        "f32@full@all",
        "f32@full+nc",
        "tq4@half",
        "tq4+fast",
        "tq4@all@full",
        "tq4+nc+nc",
        "tq4+prod+mse",
        "tq2.5+prod",
        "tq3+prod+nc",
        "tq4+seed=",
        "tq4+seed=-1",
        "tq4+seed=99999999999999999999999",
        "tq4+",
        "tq4@",
        "tq4+ub+nc",
        "tq4+plain+ub",
        "tq4+prod+ub",
        "tq4+nocenter+nocenter",
        "tq4+qw+qw",
        "kf16v3+qw",
    ] {
        assert!(CacheSpec::parse(s).is_err(), "{s:?} should be rejected");
    }
    assert!(serde_json::from_str::<CacheSpec>("\"tq9\"").is_err());
}

#[test]
fn policy_quantizes_the_scoped_layers_only() -> Result<()> {
    use crate::contract::AttentionKind;
    let tq4 = KvPrecision::Split(LayerPrecision::new(tk(Bits::B4), tq(Bits::B4)));
    let p = CacheSpec::parse("tq4")?.to_policy();
    assert_eq!(p.for_layer(0, AttentionKind::Sliding), KvPrecision::F16);
    assert_eq!(p.for_layer(5, AttentionKind::Full), tq4);
    let p: PrecisionPolicy = CacheSpec::parse("tq4@all")?.into();
    assert_eq!(p.for_layer(0, AttentionKind::Sliding), tq4);
    assert_eq!(p.for_layer(5, AttentionKind::Full), tq4);
    let p = CacheSpec::parse("tq4@sliding")?.to_policy();
    assert_eq!(p.for_layer(0, AttentionKind::Sliding), tq4);
    assert_eq!(p.for_layer(5, AttentionKind::Full), KvPrecision::F16);
    assert_eq!(
        CacheSpec::parse("f32")?.to_policy(),
        PrecisionPolicy::uniform(KvPrecision::F32)
    );
    let p = CacheSpec::parse("f32@full")?.to_policy();
    assert_eq!((p.sliding, p.full), (KvPrecision::F16, KvPrecision::F32));
    let p = CacheSpec::parse("bf16@sliding")?.to_policy();
    assert_eq!((p.sliding, p.full), (KvPrecision::BF16, KvPrecision::F16));
    Ok(())
}
