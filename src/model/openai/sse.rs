//! Provides the server-sent-events decoder the streamed body goes through.

use super::*;

/// Splits a byte stream into server-sent events and yields each event's `data`.
///
/// Lines end with `\n` (a `\r` before it is dropped). `data:` lines of one event are joined
/// with `\n`; an empty line ends the event; comment lines (`:`) and other fields (`event`,
/// `id`, `retry`) are ignored.
#[derive(Debug, Default)]
pub(super) struct SseDecoder {
    /// Bytes after the last complete line.
    pub(super) buffer: Vec<u8>,
    /// The data of the event being read.
    pub(super) data: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes; returns the data of every event they complete.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> std::result::Result<Vec<String>, LlmFailure> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(newline) = self.buffer.iter().position(|&byte| byte == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=newline).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line)
                .map_err(|_| protocol("a stream event is not valid UTF-8"))?;
            if let Some(data) = self.line(&line) {
                events.push(data);
            }
        }
        let held = self
            .buffer
            .len()
            .saturating_add(self.data.as_ref().map_or(0, String::len));
        if held > EVENT_LIMIT {
            return Err(protocol(format!(
                "a stream event exceeds {EVENT_LIMIT} bytes"
            )));
        }
        Ok(events)
    }

    /// Takes one line; returns the event's data when the line ends an event.
    pub(super) fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        None
    }

    /// Checks that the body ended between events.
    pub(super) fn finish(&self) -> std::result::Result<(), LlmFailure> {
        if self.buffer.is_empty() && self.data.is_none() {
            Ok(())
        } else {
            Err(protocol("the event stream ended mid-event"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Chunk objects and their assembly into blocks.
// ---------------------------------------------------------------------------------------------
