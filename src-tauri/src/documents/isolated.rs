//! Documents are parsed in a child process (the app binary in its hidden reader mode,
//! [`super::child`]) under a wall-clock limit and a memory limit, so a file that overflows the
//! parser's stack, makes it loop or inflates a decompression bomb costs one killed child and a
//! coded error (`document_crashed`, `document_timeout`, `document_out_of_memory`), never the
//! app, its window or the conversation. A file over the size limit is refused before it is
//! sent anywhere.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use wait_timeout::ChildExt;

use super::child::{Reply, FLAG, IMAGE_FLAG, UNREADABLE};
use super::{check_size, Document, MAX_BYTES};
use crate::error::{AppCode, CommandError, ErrorCode};

/// How long and how much memory one document may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time from spawn to reply; the child is killed past it.
    pub wall: Duration,
    /// Memory the child may hold: its resident set, watched by the parent everywhere, and
    /// its heap and anonymous memory, capped by the child itself where the system enforces it
    /// (Linux).
    pub memory_bytes: u64,
}

impl Default for Limits {
    /// 20 s is several times what `pdf-extract` takes on a 4 MiB text PDF here; 512 MiB is
    /// over a hundred times the largest file accepted.
    fn default() -> Self {
        Self {
            wall: Duration::from_secs(20),
            memory_bytes: 512 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The defaults, with `$KVLAB_DOCUMENT_TIMEOUT_MS` as the wall clock when set (the
    /// end-to-end tests shorten it).
    pub fn from_env() -> Self {
        let mut limits = Self::default();
        if let Some(ms) = std::env::var("KVLAB_DOCUMENT_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
        {
            limits.wall = Duration::from_millis(ms);
        }
        limits
    }
}

/// Most bytes of JSON a reply may take: the text limit, escaped, and the other fields.
const MAX_REPLY: u64 = 8 * MAX_BYTES as u64 + 64 * 1024;
/// Most bytes of the child's stderr kept to tell a crash's cause.
const MAX_STDERR: u64 = 256 * 1024;

/// Reads documents through child processes of `program`.
#[derive(Debug, Clone)]
pub struct Reader {
    program: PathBuf,
    limits: Limits,
}

impl Reader {
    /// A reader that runs `program` (a build of the app binary) as its child.
    pub fn new(program: PathBuf, limits: Limits) -> Self {
        Self { program, limits }
    }

    /// A reader that runs this very executable, the app binary, as its child.
    pub fn this_executable(limits: Limits) -> std::io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?, limits))
    }

    /// The file at `path` as a document: refused by its size before a byte of it is read
    /// (`document_too_large`), not a file (`document_refused`), else as [`Reader::inspect`].
    pub fn inspect_path(&self, path: &Path) -> Result<Document, CommandError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let refused = |why: String| CommandError::new(AppCode::DocumentRefused, why);
        let meta = std::fs::metadata(path).map_err(|e| refused(format!("{name}: {e}")))?;
        if !meta.is_file() {
            return Err(refused(format!("{name}: not a file")));
        }
        check_size(&name, meta.len())?;
        let bytes = std::fs::read(path).map_err(|e| refused(format!("{name}: {e}")))?;
        self.inspect(&name, &bytes)
    }

    /// The document `bytes` named `name`, or its coded refusal: everything
    /// [`super::inspect`] says, and the child's crash, timeout or memory limit.
    pub fn inspect(&self, name: &str, bytes: &[u8]) -> Result<Document, CommandError> {
        check_size(name, bytes.len() as u64)?;
        let args = [
            FLAG.to_string(),
            String::new(),
            String::new(),
            name.to_string(),
        ];
        let (status, stdout, stderr) = self.run(name, &args, bytes, MAX_REPLY)?;
        match status {
            Waited::Exited(status) if status.success() => serde_json::from_slice::<Reply>(&stdout)
                .map_err(|e| {
                    CommandError::new(
                        ErrorCode::Internal,
                        format!("{name}: the document reader's reply is unreadable: {e}"),
                    )
                })?,
            other => Err(self.ended_badly(name, other, &stderr)),
        }
    }

    /// The image `bytes` named `name`, decoded and resized for `processor` within `limits`
    /// in a child process ([`super::child::IMAGE_FLAG`]): a file it cannot read is
    /// `bad_image`; a crash, a timeout or the memory cap, as for documents.
    pub fn read_image(
        &self,
        name: &str,
        bytes: &[u8],
        processor: kvlab_engine::contract::ImageProcessor,
        limits: kvlab_engine::contract::ImageLimits,
    ) -> Result<kvlab_engine::contract::ResizedImage, CommandError> {
        super::check_image_size(name, bytes.len() as u64)?;
        let args = [
            IMAGE_FLAG.to_string(),
            String::new(),
            String::new(),
            processor.patch_size.to_string(),
            processor.pooling_kernel_size.to_string(),
            processor.max_soft_tokens.to_string(),
            limits.max_side.to_string(),
            limits.max_alloc.to_string(),
        ];
        // The reply: 16 bytes of sizes and the resized pixels, which the processor's budget
        // bounds (1,120 soft tokens of 3×3 patches of 16×16 RGB: 7.7 MB).
        let most = 16
            + processor.max_soft_tokens as u64
                * (processor.pooling_kernel_size * processor.patch_size).pow(2) as u64
                * 3;
        let (status, stdout, stderr) = self.run(name, &args, bytes, most + 1)?;
        match status {
            Waited::Exited(status) if status.success() => {
                kvlab_engine::contract::ResizedImage::from_bytes(&stdout)
                    .map_err(|e| CommandError::new(ErrorCode::BadImage, format!("{name}: {e}")))
            }
            Waited::Exited(status) if status.code() == Some(UNREADABLE) => {
                let why = stderr.lines().rev().find(|l| !l.trim().is_empty());
                Err(CommandError::new(
                    ErrorCode::BadImage,
                    format!("{name}: {}", why.unwrap_or("the image cannot be read")),
                ))
            }
            other => Err(self.ended_badly(name, other, &stderr)),
        }
    }

    /// Runs the reader's child with `args` (the mode flag, then two empty slots this fills
    /// with the memory and CPU caps, then the mode's own), `bytes` on its stdin; returns how
    /// it ended, up to `max_reply` bytes of its stdout, and its stderr.
    fn run(
        &self,
        name: &str,
        args: &[String],
        bytes: &[u8],
        max_reply: u64,
    ) -> Result<(Waited, Vec<u8>, String), CommandError> {
        let internal = |what: &str, e: std::io::Error| {
            CommandError::new(
                ErrorCode::Internal,
                format!("{name}: could not {what} the reader: {e}"),
            )
        };
        // CPU seconds: a backstop for a child whose parent died; the wall clock comes first.
        let cpu_seconds = self.limits.wall.as_secs() + 2;
        let mut args = args.to_vec();
        if let [_, memory, cpu, ..] = args.as_mut_slice() {
            *memory = self.limits.memory_bytes.to_string();
            *cpu = cpu_seconds.to_string();
        }
        let mut child = Command::new(&self.program)
            .args(&args)
            // Crashes are expected here: their one-line cause is enough, no backtrace.
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| internal("start", e))?;
        let (status, stdout, stderr) = std::thread::scope(|s| -> std::io::Result<(Waited, _, _)> {
            let mut stdin = child.stdin.take();
            let stdout = child
                .stdout
                .take()
                .map(|o| s.spawn(move || capped(o, max_reply)));
            let stderr = child
                .stderr
                .take()
                .map(|e| s.spawn(move || capped(e, MAX_STDERR)));
            // A child that dies early closes its end: a broken pipe here is expected and
            // its cause comes from the exit status.
            if let Some(mut pipe) = stdin.take() {
                s.spawn(move || {
                    let _ = pipe.write_all(bytes);
                });
            }
            let status = wait_or_kill(&mut child, &self.limits)?;
            let join = |h: Option<std::thread::ScopedJoinHandle<'_, Vec<u8>>>| {
                h.and_then(|h| h.join().ok()).unwrap_or_default()
            };
            Ok((status, join(stdout), join(stderr)))
        })
        .map_err(|e| internal("wait for", e))?;
        Ok((
            status,
            stdout,
            String::from_utf8_lossy(&stderr).into_owned(),
        ))
    }

    /// The coded error of a child that did not end with its reply.
    fn ended_badly(&self, name: &str, waited: Waited, stderr: &str) -> CommandError {
        match waited {
            Waited::OverMemory => out_of_memory(name, &self.limits),
            Waited::Exited(status) => failure(name, status, stderr, &self.limits),
            Waited::TimedOut => CommandError::new(
                AppCode::DocumentTimeout,
                format!(
                    "{name}: reading it took longer than {} s, so the reader was stopped (a file \
                     that makes the parser loop?); the conversation is untouched",
                    secs(self.limits.wall)
                ),
            ),
        }
    }
}

/// How a child's wait ended.
#[derive(Debug)]
enum Waited {
    Exited(ExitStatus),
    /// Killed at the wall clock.
    TimedOut,
    /// Killed when its resident memory passed the cap.
    OverMemory,
}

/// How often the parent looks at the child's resident memory.
const MEMORY_POLL: Duration = Duration::from_millis(20);

/// Waits for `child` up to the wall clock, reading its resident memory every [`MEMORY_POLL`]:
/// past either limit it is killed and reaped. The child caps its own memory too (Linux's
/// RLIMIT_DATA), but macOS enforces no memory rlimit, so this watch is what bounds it there.
fn wait_or_kill(child: &mut Child, limits: &Limits) -> std::io::Result<Waited> {
    let started = Instant::now();
    let mut probe = kvlab_engine::host::RssProbe::of(child.id());
    let ended = loop {
        let left = limits.wall.saturating_sub(started.elapsed());
        if left.is_zero() {
            break Waited::TimedOut;
        }
        match child.wait_timeout(left.min(MEMORY_POLL)) {
            Ok(Some(status)) => return Ok(Waited::Exited(status)),
            Ok(None) => {}
            Err(e) => {
                // Never leave a child behind whose pipes the reader threads would wait on.
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        }
        if probe.rss_bytes() > limits.memory_bytes {
            break Waited::OverMemory;
        }
    };
    // It may have exited between the last look and the kill: either way it is reaped.
    let _ = child.kill();
    child.wait()?;
    Ok(ended)
}

/// Reads up to `cap` bytes of `r`, then drains the rest so the child never blocks on a full
/// pipe (a reply over the cap is then refused as unreadable JSON).
fn capped(mut r: impl Read, cap: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = (&mut r).take(cap).read_to_end(&mut out);
    let _ = std::io::copy(&mut r, &mut std::io::sink());
    out
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// The coded error for a child that did not exit cleanly, from what Rust's runtime printed
/// (a stack overflow, a failed allocation) and how it ended.
fn failure(name: &str, status: ExitStatus, stderr: &str, limits: &Limits) -> CommandError {
    if stderr.contains("has overflowed its stack") {
        return CommandError::new(
            AppCode::DocumentCrashed,
            format!(
                "{name}: the document reader crashed on it (a stack overflow: objects nested or \
                 referring to themselves too deeply); the conversation is untouched"
            ),
        );
    }
    if stderr.contains("memory allocation of") {
        return out_of_memory(name, limits);
    }
    if killed_by(status, CPU_SIGNAL) {
        return CommandError::new(
            AppCode::DocumentTimeout,
            format!(
                "{name}: reading it used up its CPU time, so the reader was stopped; the \
                 conversation is untouched"
            ),
        );
    }
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    CommandError::new(
        AppCode::DocumentCrashed,
        format!(
            "{name}: the document reader crashed on it ({status}{}); the conversation is \
             untouched",
            last.map(|l| format!(": {l}")).unwrap_or_default()
        ),
    )
}

fn out_of_memory(name: &str, limits: &Limits) -> CommandError {
    CommandError::new(
        AppCode::DocumentOutOfMemory,
        format!(
            "{name}: reading it needed more than {} MiB of memory, so the reader was stopped \
             (a compressed stream that inflates without end?); the conversation is untouched",
            limits.memory_bytes / (1024 * 1024)
        ),
    )
}

#[cfg(unix)]
const CPU_SIGNAL: i32 = libc::SIGXCPU;
#[cfg(not(unix))]
const CPU_SIGNAL: i32 = 0;

#[cfg(unix)]
fn killed_by(status: ExitStatus, signal: i32) -> bool {
    std::os::unix::process::ExitStatusExt::signal(&status) == Some(signal)
}

#[cfg(not(unix))]
fn killed_by(_status: ExitStatus, _signal: i32) -> bool {
    false
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The parent's watch alone (the child here caps nothing): a process that fills 400 MB
    /// is killed once its resident memory passes a 64 MiB cap, well before its wall clock.
    #[test]
    fn a_child_past_its_memory_is_killed_by_the_watch() {
        let mut child = Command::new("perl")
            .args(["-e", "my $x = 'a' x 400_000_000; sleep 30"])
            .spawn()
            .expect("perl (Debian's perl-base, macOS's own)");
        let limits = Limits {
            wall: Duration::from_secs(20),
            memory_bytes: 64 << 20,
        };
        let started = Instant::now();
        let waited = wait_or_kill(&mut child, &limits).expect("wait");
        assert!(matches!(waited, Waited::OverMemory), "{waited:?}");
        assert!(started.elapsed() < Duration::from_secs(15));
        // And one within its limits exits as usual.
        let mut fine = Command::new("perl")
            .args(["-e", "exit 0"])
            .spawn()
            .expect("perl");
        let waited = wait_or_kill(&mut fine, &limits).expect("wait");
        assert!(
            matches!(waited, Waited::Exited(s) if s.success()),
            "{waited:?}"
        );
    }
}
