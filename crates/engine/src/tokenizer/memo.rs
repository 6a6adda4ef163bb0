//! The prompts a tokenizer encoded last, cut at their control strings, so that a prompt
//! sharing a prefix with one of them (a conversation's next turn, a regenerated answer)
//! encodes only the pieces that differ. Bounded in entries and bytes; an entry a longer
//! prompt extends is replaced by it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Prompts kept.
const ENTRIES: usize = 16;
/// Bytes of text kept across them (ids and spans are a fraction of that).
const BYTES: usize = 64 << 20;

/// One piece of a rendered prompt: text between control strings, or one control string.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    start: usize,
    end: usize,
    control: bool,
    /// Ids of the prompt up to the end of this piece.
    ids_end: usize,
}

impl Span {
    pub(super) fn text(start: usize, end: usize) -> Self {
        Self {
            start,
            end,
            control: false,
            ids_end: 0,
        }
    }

    pub(super) fn control(start: usize, end: usize) -> Self {
        Self {
            control: true,
            ..Self::text(start, end)
        }
    }

    /// This piece, once the prompt's ids run to `ids_end`.
    pub(super) fn ending_at(self, ids_end: usize) -> Self {
        Self { ids_end, ..self }
    }

    fn same_place(&self, other: &Span) -> bool {
        (self.start, self.end, self.control) == (other.start, other.end, other.control)
    }
}

/// A prompt as encoded: its text, ids and pieces.
#[derive(Debug)]
pub(super) struct Encoded {
    text: String,
    ids: Vec<u32>,
    spans: Vec<Span>,
}

impl Encoded {
    pub(super) fn new(text: &str, ids: Vec<u32>, spans: Vec<Span>) -> Self {
        Self {
            text: text.to_owned(),
            ids,
            spans,
        }
    }
}

/// An earlier prompt and how many leading bytes the new one shares with it.
pub(super) struct Reuse {
    earlier: Arc<Encoded>,
    common: usize,
}

impl Reuse {
    /// The ids of the new prompt's `k`th piece `span`, when the earlier prompt had the same
    /// piece at the same place inside the shared prefix (so the same text, encoded the same
    /// way).
    pub(super) fn ids_of(&self, k: usize, span: &Span) -> Option<&[u32]> {
        let old = self.earlier.spans.get(k)?;
        if !old.same_place(span) || span.end > self.common {
            return None;
        }
        let from = match k {
            0 => 0,
            _ => self.earlier.spans[k - 1].ids_end,
        };
        self.earlier.ids.get(from..old.ids_end)
    }
}

/// The last prompts encoded, most recent last.
#[derive(Debug, Default)]
pub(super) struct Memo {
    entries: Mutex<VecDeque<Arc<Encoded>>>,
}

impl Memo {
    /// The kept prompt sharing the longest prefix with `text`, if any shares one.
    pub(super) fn closest(&self, text: &str) -> Option<Reuse> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .map(|e| (common_prefix(e.text.as_bytes(), text.as_bytes()), e))
            .filter(|(common, _)| *common > 0)
            .max_by_key(|(common, _)| *common)
            .map(|(common, e)| Reuse {
                earlier: Arc::clone(e),
                common,
            })
    }

    /// Keeps `encoded`, replacing the prompts it extends and dropping the oldest past the
    /// bounds.
    pub(super) fn keep(&self, encoded: Encoded) {
        if encoded.text.len() > BYTES {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| !encoded.text.starts_with(e.text.as_str()));
        entries.push_back(Arc::new(encoded));
        let mut bytes: usize = entries.iter().map(|e| e.text.len()).sum();
        while entries.len() > ENTRIES || bytes > BYTES {
            match entries.pop_front() {
                Some(e) => bytes -= e.text.len(),
                None => break,
            }
        }
    }
}

/// Leading bytes `a` and `b` share (compared 64 at a time, then one by one).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 64 <= n && a[i..i + 64] == b[i..i + 64] {
        i += 64;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_counts_shared_bytes() {
        let a = "x".repeat(200) + "abc";
        let b = "x".repeat(200) + "abd";
        assert_eq!(common_prefix(a.as_bytes(), b.as_bytes()), 202);
        assert_eq!(common_prefix(b"", b"abc"), 0);
        assert_eq!(common_prefix(b"abc", b"abc"), 3);
    }

    #[test]
    fn an_extended_prompt_replaces_the_one_it_extends_and_the_oldest_go() {
        let memo = Memo::default();
        memo.keep(Encoded::new("ab", vec![1], vec![]));
        memo.keep(Encoded::new("abcd", vec![1, 2], vec![]));
        memo.keep(Encoded::new("xyz", vec![3], vec![]));
        assert_eq!(memo.entries.lock().unwrap().len(), 2);
        let r = memo.closest("abce").unwrap();
        assert_eq!((r.earlier.text.as_str(), r.common), ("abcd", 3));
        assert!(memo.closest("q").is_none());
        for i in 0..40 {
            memo.keep(Encoded::new(&format!("{i}-"), vec![], vec![]));
        }
        assert_eq!(memo.entries.lock().unwrap().len(), ENTRIES);
    }
}
