//! Who a request is from, and which conversations it may reach. A client is its connection's
//! peer address and the bearer token it sends (none counts as one token): its conversations
//! live in a namespace of their own, `api:` and 16 hex digits of a digest of both, so no
//! other client can name, list, read, cut or re-encode them. Without a key, every program
//! on this machine that sends no token (or the same one) is one client; a program that wants
//! its conversations apart sends a token of its own. The engine shares its queue's and
//! running places between these namespaces (the engine's worker).

use std::net::IpAddr;

use axum::http::{header, HeaderMap};
use kvlab_engine::contract::{ConversationChoice, ConversationId};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The namespace of every conversation clients of this server run in: no request reaches
/// the app's own conversations, whatever it names.
pub const CONVERSATION_PREFIX: &str = "api:";

/// Bytes of a conversation name a client may choose (the id's limit less its namespace).
pub const MAX_NAME_BYTES: usize = kvlab_engine::contract::MAX_ID_BYTES - NAMESPACE_BYTES;

/// `api:`, 16 hex digits and `:`.
const NAMESPACE_BYTES: usize = CONVERSATION_PREFIX.len() + 16 + 1;

/// The peer address of a connection, put on each of its requests by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub IpAddr);

/// A request's client (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// `api:<16 hex digits>:`.
    namespace: String,
}

impl Client {
    /// The client of a request from `peer` (unknown: in-process callers) with `headers`.
    pub fn of(peer: Option<IpAddr>, headers: &HeaderMap) -> Self {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let mut digest = Sha256::new();
        digest.update(peer.map_or_else(String::new, |p| p.to_string()).as_bytes());
        digest.update([0]);
        digest.update(token.as_bytes());
        let hex: String = digest.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Self {
            namespace: format!("{CONVERSATION_PREFIX}{hex}:"),
        }
    }

    /// The conversation a request runs in: the one it names (its own, in its namespace), or,
    /// named none, the unnamed one of its own that its prompt continues, else a new one
    /// with an unguessable id.
    pub fn conversation(&self, name: Option<&str>) -> Result<ConversationChoice, ApiError> {
        let Some(name) = name else {
            return Ok(ConversationChoice::Continuing {
                prefix: self.namespace.clone(),
            });
        };
        if name.is_empty() {
            return Err(ApiError::invalid(
                "conversation: an empty name names no conversation; send none for a new one",
            ));
        }
        let id = ConversationId::new(format!("{}{name}", self.namespace)).map_err(|_| {
            ApiError::invalid(format!(
                "conversation: a name is 1 to {MAX_NAME_BYTES} letters, digits and `-_.:`"
            ))
        })?;
        Ok(ConversationChoice::Id { id })
    }

    /// The name `id` has for this client, when it is this client's.
    pub fn name_of<'a>(&self, id: &'a str) -> Option<&'a str> {
        id.strip_prefix(self.namespace.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(token: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = token {
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
            );
        }
        h
    }

    fn id(choice: ConversationChoice) -> String {
        match choice {
            ConversationChoice::Id { id } => id.as_str().to_owned(),
            ConversationChoice::Continuing { prefix } => prefix,
        }
    }

    #[test]
    fn clients_are_apart_by_address_and_token() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let a = Client::of(Some(local), &headers(Some("a")));
        let b = Client::of(Some(local), &headers(Some("b")));
        let none = Client::of(Some(local), &headers(None));
        let other_peer = Client::of(Some("127.0.0.2".parse().unwrap()), &headers(Some("a")));
        assert_eq!(a, Client::of(Some(local), &headers(Some("a"))));
        for other in [&b, &none, &other_peer] {
            assert_ne!(&a, other);
        }
        // The same name is a different conversation for each.
        let chat_a = id(a.conversation(Some("chat")).unwrap());
        let chat_b = id(b.conversation(Some("chat")).unwrap());
        assert_ne!(chat_a, chat_b);
        assert_eq!(a.name_of(&chat_a), Some("chat"));
        assert_eq!(b.name_of(&chat_a), None);
        // The namespace holds no trace of the token.
        assert!(!chat_a.contains("Bearer") && chat_a.starts_with("api:"));
    }

    #[test]
    fn names_are_checked() {
        let c = Client::of(None, &HeaderMap::new());
        assert!(c.conversation(Some("")).is_err());
        assert!(c.conversation(Some("a/b")).is_err());
        assert!(c.conversation(Some(&"x".repeat(MAX_NAME_BYTES))).is_ok());
        assert!(c
            .conversation(Some(&"x".repeat(MAX_NAME_BYTES + 1)))
            .is_err());
        let unnamed = id(c.conversation(None).unwrap());
        assert_eq!(unnamed.len(), NAMESPACE_BYTES);
    }
}
