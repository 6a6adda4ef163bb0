//! The document reader's side of the process boundary: `kvlab-app --parse-document MEMORY
//! CPU_SECONDS NAME` caps its own memory, CPU time and core dumps, reads the file's bytes from
//! stdin, runs [`super::inspect`] and writes the result as one JSON value to stdout, then exits
//! 0. Anything worse (a stack overflow, an allocation over the cap) kills only this process;
//! the parent ([`super::isolated`]) reads what happened from the exit status and stderr.

use std::ffi::OsString;
use std::io::{Read, Write};

use super::{inspect, Document, MAX_BYTES};
use crate::error::CommandError;

/// The hidden first argument that turns the app binary into the document reader.
pub const FLAG: &str = "--parse-document";

/// What the child writes to stdout: serde's `{"Ok": Document}` or `{"Err": {code, message}}`.
pub type Reply = Result<Document, CommandError>;

/// The hidden first argument that turns the app binary into the image reader:
/// `kvlab-app --read-image MEMORY CPU_SECONDS PATCH POOLING SOFT_TOKENS MAX_SIDE MAX_ALLOC`
/// decodes the file on stdin within the limits and resizes it for the model's processor,
/// writing [`kvlab_engine::contract::ResizedImage::to_bytes`] to stdout; a file it cannot
/// read is exit code [`UNREADABLE`] with the reason on stderr's last line.
pub const IMAGE_FLAG: &str = "--read-image";

/// The image reader's exit code for a file it refused.
pub const UNREADABLE: i32 = 4;

/// Runs the reader when `args` (without the program name) start with [`FLAG`] or
/// [`IMAGE_FLAG`], returning the process exit code; `None` for a normal app start.
pub fn main_if_asked(args: &[OsString]) -> Option<i32> {
    match args.first().and_then(|a| a.to_str()) {
        Some(FLAG) => Some(run(&args[1..])),
        Some(IMAGE_FLAG) => Some(run_image(&args[1..])),
        _ => None,
    }
}

fn run_image(args: &[OsString]) -> i32 {
    let numbers: Option<Vec<u64>> = args.iter().map(number).collect();
    let Some([memory, cpu, patch, pooling, soft, side, alloc]) = numbers
        .as_deref()
        .and_then(|n| <[u64; 7]>::try_from(n).ok())
    else {
        eprintln!("usage: kvlab-app {IMAGE_FLAG} MEMORY CPU PATCH POOLING SOFT_TOKENS MAX_SIDE MAX_ALLOC < file");
        return 2;
    };
    limit_self(memory, cpu);
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(super::MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
    {
        eprintln!("{IMAGE_FLAG}: reading stdin: {e}");
        return 3;
    }
    if bytes.len() > super::MAX_IMAGE_BYTES {
        eprintln!(
            "the file is over the {} MiB limit",
            super::MAX_IMAGE_BYTES >> 20
        );
        return UNREADABLE;
    }
    let processor = kvlab_engine::contract::ImageProcessor {
        patch_size: patch as usize,
        pooling_kernel_size: pooling as usize,
        max_soft_tokens: soft as usize,
    };
    let limits = kvlab_engine::contract::ImageLimits {
        max_side: u32::try_from(side).unwrap_or(u32::MAX),
        max_alloc: alloc,
    };
    match processor.read(&bytes, limits) {
        Ok(resized) => {
            let mut out = std::io::stdout().lock();
            match out
                .write_all(&resized.to_bytes())
                .and_then(|()| out.flush())
            {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{IMAGE_FLAG}: writing the reply: {e}");
                    3
                }
            }
        }
        Err(e) => {
            eprintln!("{e}");
            UNREADABLE
        }
    }
}

fn run(args: &[OsString]) -> i32 {
    let [memory, cpu, name] = args else {
        eprintln!("usage: kvlab-app {FLAG} MEMORY_BYTES CPU_SECONDS NAME < file");
        return 2;
    };
    let (Some(memory), Some(cpu)) = (number(memory), number(cpu)) else {
        eprintln!("{FLAG}: MEMORY_BYTES and CPU_SECONDS must be whole numbers");
        return 2;
    };
    limit_self(memory, cpu);
    // One byte over the limit is enough for `inspect` to refuse the file by its size.
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
    {
        eprintln!("{FLAG}: reading stdin: {e}");
        return 3;
    }
    let reply: Reply = inspect(&name.to_string_lossy(), &bytes);
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &reply)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush());
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{FLAG}: writing the reply: {e}");
            3
        }
    }
}

fn number(s: &OsString) -> Option<u64> {
    s.to_str()?.parse().ok()
}

/// Caps this process: data segment and anonymous memory (Linux's RLIMIT_DATA, so the shared
/// libraries the app binary maps do not count against it; the address space elsewhere, which
/// macOS accepts but does not enforce: there the parent's watch of the resident memory is the
/// bound, see [`super::isolated`]), CPU
/// seconds (a backstop should the parent die before its wall clock fires) and core dumps (a
/// crash here is expected and must not litter the disk). Failures are reported, not fatal:
/// the parent's wall clock still holds.
#[cfg(unix)]
fn limit_self(memory: u64, cpu_seconds: u64) {
    #[cfg(target_os = "linux")]
    let memory_resource = libc::RLIMIT_DATA;
    #[cfg(not(target_os = "linux"))]
    let memory_resource = libc::RLIMIT_AS;
    let caps = [
        (memory_resource, memory, "memory"),
        (libc::RLIMIT_CPU, cpu_seconds, "cpu"),
        (libc::RLIMIT_CORE, 0, "core"),
    ];
    for (resource, value, what) in caps {
        let lim = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: setrlimit reads the struct we pass and touches no Rust-owned memory.
        if unsafe { libc::setrlimit(resource, &lim) } != 0 {
            eprintln!(
                "{FLAG}: could not cap {what}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(not(unix))]
fn limit_self(_memory: u64, _cpu_seconds: u64) {
    // No rlimit here: the parent's wall clock is the limit.
}
