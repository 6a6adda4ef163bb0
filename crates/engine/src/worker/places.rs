//! Places in the queue and in the running set, shared fairly between clients. A client is the
//! namespace of the conversation a request runs in: what comes before the last `:` of its id
//! (`api:3f…` for a server client, see the server's conversation ids), or the local user
//! (the app's own chats, the CLI, comparisons) when there is none. A place is taken only once
//! a request is ready to run and is given back on every path by its guard's drop.
//!
//! The rules, all applied where a place is taken or a request starts:
//! - at most [`MAX_QUEUED`] requests wait; a namespaced client holds at most
//!   [`PER_CLIENT_QUEUED`] of those places, so another client always finds one;
//! - at most `parallel` requests run ([`crate::conversations::PoolSettings::parallel`]);
//! - with `reserve_for_user` (the app), namespaced clients together never take the last
//!   [`USER_QUEUED`] waiting places nor the last running place (when there are two or more):
//!   the user's own chats keep them;
//! - the next request to start is the waiting one whose client runs fewest (then the oldest).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{lock, JobError, MAX_QUEUED};
use crate::contract::{ConversationChoice, ConversationId};

/// Waiting places one namespaced client may hold.
pub const PER_CLIENT_QUEUED: usize = MAX_QUEUED / 2;

/// Waiting places namespaced clients never take while the user's are reserved.
pub const USER_QUEUED: usize = MAX_QUEUED / 4;

/// The client a request is for (see the module doc): `""` is the local user.
pub(crate) fn client_of(choice: &Option<ConversationChoice>) -> String {
    let name = match choice {
        None => return String::new(),
        Some(ConversationChoice::Id { id }) => id.as_str(),
        Some(ConversationChoice::Continuing { prefix }) => prefix.as_str(),
    };
    name.rsplit_once(':')
        .map_or_else(String::new, |(ns, _)| ns.to_owned())
}

/// The client whose conversation `id` is (see [`client_of`]).
pub(crate) fn client_of_id(id: &ConversationId) -> &str {
    id.as_str().rsplit_once(':').map_or("", |(ns, _)| ns)
}

/// Who holds the waiting places now.
#[derive(Debug, Default)]
pub(crate) struct Places {
    waiting: usize,
    by_client: HashMap<String, usize>,
}

impl Places {
    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting
    }
}

/// A waiting place, given back when it is dropped unless its request started first.
#[derive(Debug)]
pub(crate) struct PlaceGuard {
    places: Arc<Mutex<Places>>,
    client: String,
    held: bool,
}

impl PlaceGuard {
    /// Takes a waiting place for `client`, or refuses with `queue_full` (see the rules).
    pub fn take(
        places: &Arc<Mutex<Places>>,
        client: String,
        reserve_for_user: bool,
    ) -> Result<Self, JobError> {
        let mut p = lock(places);
        let mine = p.by_client.get(&client).copied().unwrap_or(0);
        let refused = if client.is_empty() {
            p.waiting >= MAX_QUEUED
        } else {
            let cap = if reserve_for_user {
                MAX_QUEUED - USER_QUEUED
            } else {
                MAX_QUEUED
            };
            p.waiting >= cap || mine >= PER_CLIENT_QUEUED
        };
        if refused {
            return Err(JobError::queue_full());
        }
        p.waiting += 1;
        *p.by_client.entry(client.clone()).or_insert(0) += 1;
        drop(p);
        Ok(Self {
            places: Arc::clone(places),
            client,
            held: true,
        })
    }

    /// The client it is held for.
    pub fn client(&self) -> &str {
        &self.client
    }

    /// Gives the place back now (its request started, or left); later calls do nothing.
    pub fn release(&mut self) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        let mut p = lock(&self.places);
        p.waiting = p.waiting.saturating_sub(1);
        if let Some(n) = p.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                p.by_client.remove(&self.client);
            }
        }
    }
}

impl Drop for PlaceGuard {
    fn drop(&mut self) {
        self.release();
    }
}

/// Whether a request of `client` may start now, given how many requests run (at most
/// `parallel`) and how many of them are namespaced clients' (see the rules).
pub(crate) fn may_start(
    client: &str,
    running: usize,
    namespaced_running: usize,
    reserve_for_user: bool,
    parallel: usize,
) -> bool {
    if running >= parallel.max(1) {
        return false;
    }
    client.is_empty() || !reserve_for_user || namespaced_running + 1 < parallel.max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_its_conversations_namespace() {
        let id = |s: &str| {
            Some(ConversationChoice::Id {
                id: ConversationId::new(s).unwrap(),
            })
        };
        assert_eq!(client_of(&None), "");
        assert_eq!(client_of(&id("s-12")), "");
        assert_eq!(client_of(&id("api:ab12:chat")), "api:ab12");
        let prefix = Some(ConversationChoice::Continuing {
            prefix: "api:ab12:".into(),
        });
        assert_eq!(client_of(&prefix), "api:ab12");
    }

    #[test]
    fn places_are_shared_and_always_given_back() {
        let places = Arc::new(Mutex::new(Places::default()));
        // One client takes what it may, and no more.
        let greedy: Vec<_> = (0..PER_CLIENT_QUEUED)
            .map(|_| PlaceGuard::take(&places, "api:a".into(), true).unwrap())
            .collect();
        assert!(PlaceGuard::take(&places, "api:a".into(), true).is_err());
        // Another client still finds places, up to the user's reserve.
        let other: Vec<_> = (0..MAX_QUEUED - USER_QUEUED - PER_CLIENT_QUEUED)
            .map(|_| PlaceGuard::take(&places, "api:b".into(), true).unwrap())
            .collect();
        assert!(PlaceGuard::take(&places, "api:c".into(), true).is_err());
        // The user's own places are there.
        let user: Vec<_> = (0..USER_QUEUED)
            .map(|_| PlaceGuard::take(&places, String::new(), true).unwrap())
            .collect();
        assert!(PlaceGuard::take(&places, String::new(), true).is_err());
        assert_eq!(lock(&places).waiting(), MAX_QUEUED);
        // Every drop gives its place back, and a release then a drop gives it back once.
        let mut first = PlaceGuard::take(&places, String::new(), false);
        assert!(first.is_err());
        drop(greedy);
        first = PlaceGuard::take(&places, String::new(), false);
        let mut first = first.unwrap();
        first.release();
        drop(first);
        drop((other, user));
        assert_eq!(lock(&places).waiting(), 0);
        assert!(lock(&places).by_client.is_empty());
    }

    #[test]
    fn the_last_running_place_is_the_users_when_reserved() {
        use crate::worker::MAX_RUNNING;
        assert!(may_start("api:a", 2, 2, true, MAX_RUNNING));
        assert!(!may_start("api:a", 3, 3, true, MAX_RUNNING));
        assert!(may_start("", 3, 3, true, MAX_RUNNING));
        assert!(may_start("api:a", 3, 3, false, MAX_RUNNING));
        assert!(!may_start("", MAX_RUNNING, 0, true, MAX_RUNNING));
        // One at a time: one runs; with the user's place kept, the API still gets one.
        assert!(may_start("api:a", 0, 0, true, 1));
        assert!(!may_start("", 1, 1, true, 1));
        // Eight at once: the API may take seven.
        assert!(may_start("api:a", 6, 6, true, 8));
        assert!(!may_start("api:a", 7, 7, true, 8));
    }
}
