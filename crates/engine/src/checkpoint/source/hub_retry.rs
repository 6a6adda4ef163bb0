//! How Hub requests are retried, and how a failure becomes a [`SourceError`] that says what to
//! do. Transient failures (the connection drops or never opens, 408, 5xx, a body cut short)
//! are retried with exponential backoff; a 429 waits as long as the server's `Retry-After`
//! asks when that is short, and fails at once, saying how long to wait, when it is not.
//! hf-hub's own retries are switched off ([`RetryPolicy`] is the one policy), so every wait
//! is counted, cancellable and named in the final error.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use hf_hub::HFError;

use super::hub_fetch::cancellable;
use super::SourceError;

/// How hard to try before giving up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per request (the first included); at least 1.
    pub attempts: u32,
    /// The wait before the first retry; each further retry waits twice as long.
    pub base_delay: Duration,
    /// No backoff wait exceeds this.
    pub max_delay: Duration,
    /// A 429 whose `Retry-After` asks for more than this fails at once instead of waiting.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// Four tries, 0.5 s, 1 s and 2 s apart (3.5 s in all before an unreachable Hub falls back
    /// to a finished snapshot); a rate limit is waited out when it asks for 30 s or less.
    fn default() -> Self {
        Self {
            attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The backoff before retry number `retry` (0 for the first retry).
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(20)).unwrap_or(u32::MAX);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }
}

/// What to do after a failed try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Wait this long, then try again (if tries are left).
    Retry(Duration),
    /// Retrying cannot help (or the server asked for a wait too long to sit through).
    Fail,
}

/// The HTTP status of an error that carries one.
fn status(e: &HFError) -> Option<u16> {
    match e {
        HFError::Http { context }
        | HFError::AuthRequired { context }
        | HFError::Forbidden { context }
        | HFError::Conflict { context }
        | HFError::RateLimited { context, .. } => Some(context.status.as_u16()),
        HFError::RepoNotFound { .. }
        | HFError::RevisionNotFound { .. }
        | HFError::EntryNotFound { .. } => Some(404),
        _ => None,
    }
}

/// Whether a failed try of `e` (retry number `retry`) is worth another.
pub(super) fn verdict(e: &HFError, policy: &RetryPolicy, retry: u32) -> Verdict {
    match e {
        HFError::RateLimited { retry_after, .. } => match retry_after {
            Some(wait) if *wait > policy.max_retry_after => Verdict::Fail,
            Some(wait) => Verdict::Retry(*wait),
            None => Verdict::Retry(policy.backoff(retry)),
        },
        // Transport failures: refused or dropped connections, timeouts, bodies cut short.
        HFError::Request { .. } => Verdict::Retry(policy.backoff(retry)),
        _ => match status(e) {
            Some(408 | 500 | 502 | 503 | 504) => Verdict::Retry(policy.backoff(retry)),
            _ => Verdict::Fail,
        },
    }
}

/// What happened over all tries, for the final message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tries {
    /// Tries made.
    pub made: u32,
    /// Time spent waiting between them.
    pub waited: Duration,
}

/// Runs `op` until it succeeds, fails for good, runs out of tries or is cancelled. Returns
/// the last error with the tally of tries.
pub(super) async fn retry<T, F, Fut>(
    policy: &RetryPolicy,
    cancel: &AtomicBool,
    mut op: F,
) -> Result<Result<T, (HFError, Tries)>, SourceError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, HFError>>,
{
    let mut tries = Tries::default();
    loop {
        let result = cancellable(op(), cancel).await?;
        tries.made += 1;
        let e = match result {
            Ok(v) => return Ok(Ok(v)),
            Err(e) => e,
        };
        match verdict(&e, policy, tries.made - 1) {
            Verdict::Retry(wait) if tries.made < policy.attempts.max(1) => {
                pause(wait, cancel).await?;
                tries.waited += wait;
            }
            _ => return Ok(Err((e, tries))),
        }
    }
}

/// Sleeps `wait`, or less if `cancel` is set meanwhile.
pub(super) async fn pause(wait: Duration, cancel: &AtomicBool) -> Result<(), SourceError> {
    cancellable(tokio::time::sleep(wait), cancel).await
}

/// The gated-repository advice shared by 401 and 403.
fn token_help(repo: &str) -> String {
    format!(
        "accept the model's license at https://huggingface.co/{repo} if it is gated, create a \
         read token at https://huggingface.co/settings/tokens, and start KV Lab with it in the \
         environment (`export HF_TOKEN=hf_...`, or `hf auth login` once)"
    )
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The error the user sees for the last failure `e` of `repo` after `tries`.
pub(super) fn to_source_error(repo: &str, e: HFError, tries: Tries) -> SourceError {
    let repo_s = repo.to_owned();
    match e {
        HFError::RepoNotFound { .. }
        | HFError::RevisionNotFound { .. }
        | HFError::EntryNotFound { .. } => SourceError::HubNotFound {
            reason: format!(
                "{e}; check the owner/name (and revision) on https://huggingface.co/{repo}"
            ),
            repo: repo_s,
        },
        HFError::AuthRequired { .. } => SourceError::HubAuth {
            status: 401,
            advice: format!(
                "it needs a Hugging Face token (no token was sent, or it was refused): {}",
                token_help(repo)
            ),
            repo: repo_s,
        },
        HFError::Forbidden { .. } => SourceError::HubAuth {
            status: 403,
            advice: format!(
                "the token sent has no access to it (a gated repository whose license this \
                 account has not accepted, or a fine-grained token without access to gated \
                 repositories): {}",
                token_help(repo)
            ),
            repo: repo_s,
        },
        HFError::RateLimited { retry_after, .. } => SourceError::RateLimited {
            repo: repo_s,
            retry_after_s: retry_after.map(|d| d.as_secs()),
            tries: tries.made,
        },
        ref other => match status(other) {
            Some(code @ 500..=599) | Some(code @ 408) => SourceError::HubUnavailable {
                repo: repo_s,
                status: code,
                tries: tries.made,
                waited: secs(tries.waited),
            },
            _ => SourceError::Network {
                reason: if tries.made > 1 {
                    format!(
                        "{other} (tried {} times over {})",
                        tries.made,
                        secs(tries.waited)
                    )
                } else {
                    other.to_string()
                },
                repo: repo_s,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let p = RetryPolicy::default();
        let waits: Vec<u64> = (0..6).map(|r| p.backoff(r).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(p.backoff(u32::MAX), p.max_delay);
    }
}
