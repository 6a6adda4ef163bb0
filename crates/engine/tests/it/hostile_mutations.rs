//! A mutation campaign over real model headers: the tiny GGUF and safetensors checkpoints and
//! the header of the real Gemma 3 270M GGUF, with bytes flipped, integers overwritten by
//! hostile values (0, 2^32, 2^40, u64::MAX, ...), numbers in the safetensors JSON replaced and
//! files cut short. Every mutant goes through the paths a user's file takes (inspect, load,
//! the GGUF tokenizer); each must load or be refused with a model-file code, never panic, and
//! never make a single allocation larger than a few times the file because its header said
//! so (a counting allocator watches the test's own thread).
//!
//! The CI run is fixed-seed and bounded (`KVLAB_HOSTILE_CASES`, default 200 per small seed and
//! an eighth of that for the real header: about 10 s in the test build); about a minute with
//! fresh seeds: `KVLAB_HOSTILE_CASES=2500 KVLAB_HOSTILE_SEED=random cargo test <the CI package
//! and feature list> --test hostile_mutations -- --nocapture` (1000 cases took 25 s here). Failing cases shrink and are kept in
//! `hostile_mutations.proptest-regressions`, which is committed and replayed first.

use crate::common;

// HOSTILE lines go to the stderr handle itself, which libtest does not capture, so
// scripts/hostile.sh finds them in an ordinary `cargo test` log.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;
use std::path::Path;

use kvlab_engine::contract::ErrorCode;
use kvlab_engine::lab::Model;
use kvlab_engine::LoadOptions;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};

/// Wraps the system allocator to remember the largest single request of each thread.
struct Largest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: allocations during thread teardown find no slot, and are not ours.
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

// SAFETY: every call is forwarded to `System` unchanged; only the size is recorded.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

/// Runs `f`, returning its result and the largest single allocation it made on this thread.
fn watched<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|c| c.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

fn config() -> Config {
    let cases = std::env::var("KVLAB_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rng_seed = match std::env::var("KVLAB_HOSTILE_SEED").as_deref() {
        Ok("random") => RngSeed::Random,
        Ok(v) => RngSeed::Fixed(v.parse().unwrap_or(14)),
        Err(_) => RngSeed::Fixed(14),
    };
    Config {
        cases,
        rng_seed,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

/// One change to a file's bytes.
#[derive(Debug, Clone)]
enum Edit {
    /// Flips a bit of the byte at this fraction of the header.
    Flip { at: f64, bit: u8 },
    /// Writes `value` (its low `width` bytes, little-endian) at this fraction of the header.
    Word { at: f64, width: u8, value: u64 },
    /// Replaces the `nth` run of ASCII digits in the header by `value` in decimal.
    Number { nth: usize, value: u64 },
    /// Cuts the file at this fraction of its header.
    Cut { at: f64 },
}

/// Integers a lying header would hold.
fn hostile_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(3),
        Just(9),
        Just(0xFF),
        Just(0xFFFF),
        Just(1 << 31),
        Just(u64::from(u32::MAX)),
        Just(1 << 32),
        Just(1 << 40),
        Just(1 << 62),
        Just(u64::MAX),
        any::<u64>(),
        0u64..4096,
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0.0..1.0f64, 0u8..8).prop_map(|(at, bit)| Edit::Flip { at, bit }),
        (
            0.0..1.0f64,
            prop_oneof![Just(1u8), Just(2), Just(4), Just(8)],
            hostile_value()
        )
            .prop_map(|(at, width, value)| Edit::Word { at, width, value }),
        (0usize..512, hostile_value()).prop_map(|(nth, value)| Edit::Number { nth, value }),
        (0.0..1.0f64).prop_map(|at| Edit::Cut { at }),
    ]
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(edit(), 1..4)
}

/// `file` with `edits` applied within its first `header` bytes.
fn mutate(file: &[u8], header: usize, edits: &[Edit]) -> Vec<u8> {
    let mut b = file.to_vec();
    let spot =
        |at: f64, b: &Vec<u8>| ((at * header as f64) as usize).min(b.len().saturating_sub(1));
    for e in edits {
        match *e {
            Edit::Flip { at, bit } if !b.is_empty() => {
                let i = spot(at, &b);
                b[i] ^= 1 << bit;
            }
            Edit::Word { at, width, value } => {
                let i = spot(at, &b);
                let end = (i + width as usize).min(b.len());
                let bytes = value.to_le_bytes();
                b[i..end].copy_from_slice(&bytes[..end - i]);
            }
            Edit::Number { nth, value } => {
                let limit = header.min(b.len());
                let runs = digit_runs(&b[..limit]);
                if let Some(&(s, e)) = runs.get(nth % runs.len().max(1)) {
                    b.splice(s..e, value.to_string().into_bytes());
                }
            }
            Edit::Cut { at } => {
                let i = spot(at, &b);
                b.truncate(i);
            }
            Edit::Flip { .. } => {}
        }
    }
    b
}

/// The spans of ASCII digit runs in `b`.
fn digit_runs(b: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, c) in b.iter().enumerate() {
        match (c.is_ascii_digit(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, b.len()));
    }
    runs
}

/// The codes a broken model file may come back as.
fn is_model_file_code(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::BadModelFile | ErrorCode::UnsupportedModel | ErrorCode::ModelNotFound
    )
}

/// A mutant's header can make the engine allocate at most this much at once: its weights, at
/// f32, are at most 4× the file; anything larger came from a number the header made up.
fn allocation_cap(file_len: usize) -> usize {
    4 * file_len + (1 << 20)
}

/// Loads the model at `path` (and its GGUF tokenizer), checking the outcome and allocations.
fn try_load(path: &Path, file_len: usize) -> Result<Option<ErrorCode>, TestCaseError> {
    let opts = LoadOptions::default();
    let ((inspect, load), largest) = watched(|| {
        let inspect = kvlab_engine::lab::inspect(path, &opts).map(|_| ());
        let load = Model::load(path, &opts).map(|_| ());
        (inspect, load)
    });
    prop_assert!(
        largest <= allocation_cap(file_len),
        "one allocation of {largest} bytes for a file of {file_len}"
    );
    for r in [&inspect, &load] {
        if let Err(e) = r {
            prop_assert!(is_model_file_code(e.code()), "{e:?} is {}", e.code());
        }
    }
    // Inspecting reads the headers a load reads first: what loads, inspects (a load may
    // still refuse what inspects, e.g. a renamed tensor is only missed when it is fetched).
    prop_assert!(
        inspect.is_ok() || load.is_err(),
        "{:?} vs {:?}",
        inspect,
        load
    );
    if path.extension().is_some_and(|e| e == "gguf") {
        let (tok, largest) = watched(|| kvlab_engine::lab::gguf_tokenizer_from_file(path));
        prop_assert!(
            largest <= allocation_cap(file_len),
            "tokenizer: {largest} bytes"
        );
        if let Err(e) = tok {
            let load = matches!(e, kvlab_engine::lab::TokenizerError::Load { .. });
            prop_assert!(load, "tokenizer: {e:?}");
        }
    }
    Ok(load.err().map(|e| e.code()))
}

/// Runs `cases` mutants through `test` (fixed seed, failures kept in the regressions file),
/// printing the tally line; `test` says whether the mutant was refused.
fn campaign(
    row: &str,
    cases: u32,
    strategy: impl Strategy<Value = Vec<Edit>>,
    test: impl Fn(Vec<Edit>) -> Result<Option<ErrorCode>, TestCaseError>,
) {
    let mut runner = proptest::test_runner::TestRunner::new(Config {
        cases,
        // Relative to the package root, where cargo runs tests.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/it/hostile_mutations.proptest-regressions",
        ))),
        ..config()
    });
    let (tried, refused) = (Cell::new(0u32), Cell::new(0u32));
    let codes = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let result = runner.run(&strategy, |edits| {
        let r = test(edits)?;
        tried.set(tried.get() + 1);
        if let Some(code) = r {
            refused.set(refused.get() + 1);
            codes.borrow_mut().insert(code.to_string());
        }
        Ok(())
    });
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!(
                "HOSTILE {row}: {} mutants, {} refused, the rest load -> {}",
                tried.get(),
                refused.get(),
                codes
                    .borrow()
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        )
        .as_bytes(),
    );
    if let Err(e) = result {
        panic!("{row}: {e}");
    }
}

#[test]
fn hostile_mutated_gguf_headers_are_refused_or_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = dir.path().join("seed.gguf");
    common::write_tiny_gguf(&seed, 1);
    let bytes = std::fs::read(&seed).expect("read");
    let header = header_len_gguf(&seed);
    let p = dir.path().join("m.gguf");
    campaign(
        "mutated tiny GGUF headers",
        config().cases,
        edits(),
        |edits| {
            let mutant = mutate(&bytes, header, &edits);
            std::fs::write(&p, &mutant).expect("write");
            try_load(&p, mutant.len())
        },
    );
}

#[test]
fn hostile_mutated_safetensors_headers_are_refused_or_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = common::fixture("tiny_dense");
    let bytes = std::fs::read(src.join("model.safetensors")).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8")) as usize;
    let p = dir.path().join("model.safetensors");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).expect("config");
    // Most byte edits break the JSON; numbers replaced keep it valid and reach the checks.
    let json_edits = prop::collection::vec(
        prop_oneof![
            3 => (0usize..512, hostile_value()).prop_map(|(nth, value)| Edit::Number { nth, value }),
            1 => edit(),
        ],
        1..3,
    );
    campaign(
        "mutated safetensors headers",
        config().cases,
        json_edits,
        |edits| {
            let mutant = mutate(&bytes, 8 + n, &edits);
            std::fs::write(&p, &mutant).expect("write");
            try_load(&p, mutant.len())
        },
    );
}

/// Bytes before the tensor data of a GGUF file, by candle's reader.
fn header_len_gguf(path: &Path) -> usize {
    let mut f = std::fs::File::open(path).expect("open");
    let c = candle_core::quantized::gguf_file::Content::read(&mut f).expect("gguf");
    c.tensor_data_offset as usize
}

/// The real 270M's header, mutated: only inspected (its tensors are never read), and written
/// as the header followed by a hole up to the real length, so the offsets still fit.
#[test]
fn hostile_mutated_real_gguf_headers_are_refused_or_inspect() {
    let Some(real) = kvlab_assets::require_asset!("gemma3-270m") else {
        return;
    };
    let header = header_len_gguf(&real);
    let len = std::fs::metadata(&real).expect("len").len();
    let mut bytes = vec![0u8; header];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(&real).expect("open");
        f.read_exact(&mut bytes).expect("header");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("m.gguf");
    campaign(
        "mutated real Gemma 3 270M GGUF headers",
        (config().cases / 8).max(4),
        edits(),
        |edits| {
            let mutant = mutate(&bytes, header, &edits);
            let f = std::fs::File::create(&p).expect("create");
            std::io::Write::write_all(&mut &f, &mutant).expect("write");
            if mutant.len() >= header {
                // A sparse hole where the tensor data was: no disk is used for it.
                f.set_len(len - header as u64 + mutant.len() as u64)
                    .expect("len");
            }
            drop(f);
            let (r, largest) = watched(|| kvlab_engine::lab::inspect(&p, &LoadOptions::default()));
            prop_assert!(
                largest <= allocation_cap(mutant.len()),
                "one allocation of {largest} bytes for a header of {}",
                mutant.len()
            );
            match r {
                Ok(_) => Ok(None),
                Err(e) => {
                    prop_assert!(is_model_file_code(e.code()), "{e:?}");
                    Ok(Some(e.code()))
                }
            }
        },
    );
}
