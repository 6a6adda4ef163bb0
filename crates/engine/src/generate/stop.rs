//! Stop sequences over streamed text: text is let through as it arrives, except a tail that
//! could still be the start of a stop string, which is held until the next piece decides.
//! When a stop string appears, the text before it is the answer's end; it and anything after
//! it are never sent.

/// Most stop strings a request may give (OpenAI allows 4).
pub const MAX_STOPS: usize = 4;

/// Longest stop string, in bytes: the held tail is checked against each stop at every
/// piece, so their length bounds that work.
pub const MAX_STOP_BYTES: usize = 256;

/// Watches an answer's text for its stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet let through (a possible stop string's start).
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// Whether a stop string has been seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Takes the next piece; returns the text that can be sent now. After a stop it returns
    /// only the text before the stop string, then nothing.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = self.undecided_tail();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// The text still held when the answer ends without a stop string.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of `held` that are a proper prefix of some stop string (on a
    /// character boundary).
    fn undecided_tail(&self) -> usize {
        let mut longest = 0;
        for stop in &self.stops {
            for (i, _) in self.held.char_indices() {
                let tail = &self.held[i..];
                if tail.len() < stop.len() && stop.starts_with(tail) {
                    longest = longest.max(tail.len());
                    break;
                }
            }
        }
        longest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out: String = pieces.iter().map(|p| m.push(p)).collect();
        out.push_str(&m.finish());
        (out, m.stopped())
    }

    #[test]
    fn a_stop_split_across_pieces_is_caught_and_never_sent() {
        assert_eq!(
            run(&["END"], &["one two E", "N", "D three"]),
            ("one two ".into(), true)
        );
        // The held tail is let through once it can no longer be a stop.
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("a E"), "a ");
        assert_eq!(m.push("x"), "Ex");
    }

    #[test]
    fn without_a_stop_everything_arrives_in_order() {
        assert_eq!(
            run(&["\n\n"], &["a\n", "b", "\n"]),
            ("a\nb\n".into(), false)
        );
        assert_eq!(run(&[], &["é", "t", "é"]), ("été".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["zz", "b"], &["abczz"]), ("a".into(), true));
        assert_eq!(run(&["é!"], &["ça é", "!"]), ("ça ".into(), true));
    }
}
