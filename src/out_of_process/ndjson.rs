//! Provides the line-delimited JSON wire the product providers speak (Codex's JSON-RPC, the
//! Claude CLI's stream-json): a writer, and a reader that
//! skips what is not a JSON object (malformed lines, invalid UTF-8) instead of failing.

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

/// Writes one frame a line to the child's stdin. A write that blocks (a child that stopped
/// reading) is bounded by the run's teardown, which aborts the session task.
pub(crate) struct FrameWriter {
    stdin: Option<ChildStdin>,
}

impl FrameWriter {
    pub(crate) fn new(stdin: ChildStdin) -> Self {
        Self { stdin: Some(stdin) }
    }

    /// Whether the input is still open.
    pub(crate) fn is_open(&self) -> bool {
        self.stdin.is_some()
    }

    /// Writes `frame`. A closed pipe closes the input; the reader then sees how the child
    /// ended.
    pub(crate) async fn send(&mut self, frame: &Value) {
        let Some(stdin) = &mut self.stdin else { return };
        let mut line = frame.to_string();
        line.push('\n');
        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            self.stdin = None;
        }
    }

    /// Closes the child's stdin.
    pub(crate) fn close(&mut self) {
        self.stdin = None;
    }
}

/// Reads one frame a line from the child's stdout.
pub(crate) struct FrameReader {
    reader: BufReader<ChildStdout>,
    line: Vec<u8>,
}

/// What one read gave.
pub(crate) enum Read {
    /// A JSON object.
    Frame(Value),
    /// A line that is not one (ignored by every wire).
    Garbage,
    /// The end of the stream.
    Eof,
}

impl FrameReader {
    pub(crate) fn new(stdout: ChildStdout) -> Self {
        Self {
            reader: BufReader::new(stdout),
            line: Vec::new(),
        }
    }

    /// The next line.
    ///
    /// # Cancel safety
    /// Cancel safe: a partly read line stays buffered for the next call.
    pub(crate) async fn next(&mut self) -> Read {
        match self.reader.read_until(b'\n', &mut self.line).await {
            Ok(0) if self.line.is_empty() => return Read::Eof,
            Err(_) => return Read::Eof,
            Ok(_) => {}
        }
        let line = std::mem::take(&mut self.line);
        match serde_json::from_slice::<Value>(line.trim_ascii()) {
            Ok(frame) if frame.is_object() => Read::Frame(frame),
            _ => Read::Garbage,
        }
    }
}
