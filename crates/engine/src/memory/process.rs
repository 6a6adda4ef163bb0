//! The process's own memory: its resident set now ([`RssProbe`], also of a child it watches)
//! and at peak, and handing freed heap pages back to the system after a cache shrinks.

/// Reads this process's resident memory through `sysinfo` (reuses its buffers).
pub struct RssProbe {
    sys: sysinfo::System,
    pid: Option<sysinfo::Pid>,
}

impl std::fmt::Debug for RssProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RssProbe").field("pid", &self.pid).finish()
    }
}

impl Default for RssProbe {
    fn default() -> Self {
        Self::new()
    }
}

impl RssProbe {
    /// A probe for the current process.
    pub fn new() -> Self {
        Self {
            sys: sysinfo::System::new(),
            pid: sysinfo::get_current_pid().ok(),
        }
    }

    /// A probe for another process (a child the caller watches).
    pub fn of(pid: u32) -> Self {
        Self {
            sys: sysinfo::System::new(),
            pid: Some(sysinfo::Pid::from_u32(pid)),
        }
    }

    /// Current resident set size in bytes (0 if unavailable).
    pub fn rss_bytes(&mut self) -> u64 {
        let Some(pid) = self.pid else { return 0 };
        self.sys.refresh_processes_specifics(
            sysinfo::ProcessesToUpdate::Some(&[pid]),
            false,
            sysinfo::ProcessRefreshKind::nothing().with_memory(),
        );
        self.sys.process(pid).map_or(0, |p| p.memory())
    }
}

/// Peak resident set of this process so far (`VmHWM` on Linux); `None` elsewhere, where
/// callers fall back to the largest [`RssProbe`] sample they took.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Restarts the peak counter behind [`peak_rss_bytes`] at the current resident size (Linux:
/// writes `5` to `/proc/self/clear_refs`), so a benchmark can measure the peak of one phase
/// (e.g. after the model load's transients). Returns false where unsupported.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    fn malloc_trim(pad: usize) -> i32;
}

/// Hands freed heap memory back to the operating system where the allocator keeps it
/// (glibc: `malloc_trim`), so resident memory drops after a cache shrinks (e.g. a switch
/// from f16 to TurboQuant) instead of staying at its high-water mark. No-op elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap; it takes no pointers from us.
    unsafe {
        malloc_trim(0);
    }
}
