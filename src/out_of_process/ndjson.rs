//! Provides the line-delimited JSON wire the product providers speak (Codex's JSON-RPC, the
//! Claude CLI's stream-json): a writer, and a reader that
//! skips what is not a JSON object (malformed lines, invalid UTF-8) instead of failing.

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

/// The longest line a product provider reads by default (`maxFrameBytes`): 16 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;

/// The failure category of a line longer than `maxFrameBytes`, for every provider.
pub(crate) const FRAME_TOO_LONG: &str = "frame-too-long";

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

/// Reads one frame a line from the child's stdout, a line at most `max_line` bytes: a child
/// that prints an endless line cannot make this process hold it.
pub(crate) struct FrameReader {
    reader: BufReader<ChildStdout>,
    line: Vec<u8>,
    max_line: usize,
    /// Inside a line already answered [`Read::TooLong`]: its rest is dropped, not kept.
    skipping: bool,
}

/// What one read gave.
pub(crate) enum Read {
    /// A JSON object.
    Frame(Value),
    /// A line that is not one (ignored by every wire).
    Garbage,
    /// A line longer than the reader's limit (its rest is skipped): the run fails.
    TooLong,
    /// The end of the stream.
    Eof,
}

impl FrameReader {
    pub(crate) fn new(stdout: ChildStdout, max_line: usize) -> Self {
        Self {
            reader: BufReader::new(stdout),
            line: Vec::new(),
            max_line,
            skipping: false,
        }
    }

    /// The next line.
    ///
    /// # Cancel safety
    /// Cancel safe: what was read of a line stays buffered for the next call (each piece is
    /// moved into the line and consumed with no await between).
    pub(crate) async fn next(&mut self) -> Read {
        loop {
            let available = match self.reader.fill_buf().await {
                Ok(available) => available,
                Err(_) => return Read::Eof,
            };
            if available.is_empty() {
                // The end: a last line without a newline still counts.
                if self.line.is_empty() || std::mem::take(&mut self.skipping) {
                    return Read::Eof;
                }
                break;
            }
            let (taken, ended) = match available.iter().position(|byte| *byte == b'\n') {
                Some(newline) => (newline + 1, true),
                None => (available.len(), false),
            };
            if !self.skipping {
                self.line.extend_from_slice(&available[..taken]);
            }
            self.reader.consume(taken);
            if self.skipping {
                self.skipping = !ended;
                continue;
            }
            // The newline is not the line's.
            if self.line.len() - usize::from(ended) > self.max_line {
                self.line = Vec::new();
                self.skipping = !ended;
                return Read::TooLong;
            }
            if ended {
                break;
            }
        }
        let line = std::mem::take(&mut self.line);
        match serde_json::from_slice::<Value>(line.trim_ascii()) {
            Ok(frame) if frame.is_object() => Read::Frame(frame),
            _ => Read::Garbage,
        }
    }
}

/// A child's output stream whose lines are at most `max_line` bytes, for a reader this crate
/// does not own (the ACP SDK reads its own lines): past the limit a read fails
/// (`InvalidData`) instead of handing the reader more of the line, and `exceeded` says so.
pub(crate) struct LineBounded<R> {
    inner: R,
    max_line: usize,
    /// Bytes read since the last newline.
    in_line: usize,
    exceeded: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<R> LineBounded<R> {
    /// Bounds `inner`'s lines; `exceeded` is set once a line passes `max_line`.
    pub(crate) fn new(
        inner: R,
        max_line: usize,
        exceeded: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Self {
            inner,
            max_line,
            in_line: 0,
            exceeded,
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LineBounded<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::sync::atomic::Ordering;
        if self.exceeded.load(Ordering::Acquire) {
            return std::task::Poll::Ready(Err(too_long(self.max_line)));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        std::task::ready!(std::pin::Pin::new(&mut this.inner).poll_read(cx, buf))?;
        for byte in &buf.filled()[before..] {
            if *byte == b'\n' {
                this.in_line = 0;
            } else {
                this.in_line += 1;
            }
            if this.in_line > this.max_line {
                this.exceeded.store(true, Ordering::Release);
                // A failed read hands over nothing.
                buf.set_filled(before);
                return std::task::Poll::Ready(Err(too_long(this.max_line)));
            }
        }
        std::task::Poll::Ready(Ok(()))
    }
}

fn too_long(max_line: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("the child wrote a line longer than {max_line} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    /// A reader of what `script` prints, at most `max_line` bytes a line.
    fn reading(script: &str, max_line: usize) -> (tokio::process::Child, FrameReader) {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        (child, FrameReader::new(stdout, max_line))
    }

    #[tokio::test]
    async fn a_line_past_the_limit_is_refused_and_skipped_and_the_next_one_read() {
        let (mut child, mut reader) = reading(
            r#"printf '{"a":1}\n'; head -c 100000 /dev/zero | tr '\0' x; printf '\n{"b":2222}\n'"#,
            10,
        );
        assert!(matches!(reader.next().await, Read::Frame(frame) if frame["a"] == 1));
        assert!(matches!(reader.next().await, Read::TooLong));
        assert!(
            reader.line.capacity() <= 64 << 10,
            "the skipped line was not kept"
        );
        // Exactly the limit (newline aside) is a line.
        assert!(matches!(reader.next().await, Read::Frame(frame) if frame["b"] == 2222));
        assert!(matches!(reader.next().await, Read::Eof));
        child.wait().await.unwrap();
    }

    #[tokio::test]
    async fn an_endless_line_is_refused_once_and_its_end_is_the_streams() {
        let (mut child, mut reader) = reading("head -c 200000 /dev/zero | tr '\\0' x", 1000);
        assert!(matches!(reader.next().await, Read::TooLong));
        assert!(matches!(reader.next().await, Read::Eof));
        child.wait().await.unwrap();
    }

    #[tokio::test]
    async fn a_bounded_stream_fails_past_the_limit_and_says_so() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::AsyncReadExt;
        let exceeded = std::sync::Arc::new(AtomicBool::new(false));
        let text = format!("short\n{}\nunread", "x".repeat(100));
        let mut bounded = LineBounded::new(text.as_bytes(), 64, std::sync::Arc::clone(&exceeded));
        let mut read = Vec::new();
        let error = bounded.read_to_end(&mut read).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        assert!(exceeded.load(Ordering::Acquire));
        let mut fine = LineBounded::new(
            "a\nbb\n".as_bytes(),
            2,
            std::sync::Arc::new(AtomicBool::new(false)),
        );
        let mut read = String::new();
        fine.read_to_string(&mut read).await.unwrap();
        assert_eq!(read, "a\nbb\n");
    }
}
