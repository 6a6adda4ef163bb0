//! The app's hostile inputs and faults, one test binary (linked once): documents through the
//! reader's child process, and sessions under kill -9, corruption and a full disk. Test names
//! start with `hostile_`; each fault prints a `HOSTILE <fault> -> <code>` line that
//! `scripts/hostile.sh` tallies from the ordinary `cargo test` output.

mod documents;
mod images;
mod sessions;
mod tally;
