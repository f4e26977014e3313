//! Where a program's output goes while it runs.

/// Receives a program's output as it arrives, within the spec's output limit (what is
/// over the limit is counted in the result, never passed on).
pub trait OutputSink {
    /// Bytes the program wrote to stdout, within the output limit.
    fn stdout(&mut self, _data: &[u8]) {}
    /// Bytes the program wrote to stderr, within the output limit.
    fn stderr(&mut self, _data: &[u8]) {}
}

/// An [`OutputSink`] that passes nothing on: the output is only in the result.
#[derive(Debug, Default, Clone, Copy)]
pub struct Capture;
impl OutputSink for Capture {}
