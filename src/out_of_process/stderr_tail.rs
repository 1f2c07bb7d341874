//! Provides [`StderrTail`]: a child's stderr forwarded verbatim to this process's stderr, with
//! its last bytes kept, so a child that dies before its handshake can say why in the error.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStderr;
use tokio_util::task::AbortOnDropHandle;

/// How many bytes of a child's stderr are kept.
const TAIL: usize = 2048;

/// The forwarder of one child's stderr.
pub(crate) struct StderrTail {
    tail: Arc<Mutex<Vec<u8>>>,
    forwarder: AbortOnDropHandle<()>,
}

impl StderrTail {
    /// Starts forwarding `stderr`.
    pub(crate) fn forward(stderr: ChildStderr) -> Self {
        let tail = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&tail);
        let forwarder = tokio::spawn(async move {
            let mut stderr = stderr;
            let mut host = tokio::io::stderr();
            let mut chunk = vec![0_u8; 4096];
            while let Ok(read) = stderr.read(&mut chunk).await {
                if read == 0 {
                    break;
                }
                // A failed write to our own stderr changes nothing about the child.
                let _ = host.write_all(&chunk[..read]).await;
                let mut tail = kept.lock().unwrap_or_else(PoisonError::into_inner);
                tail.extend_from_slice(&chunk[..read]);
                let excess = tail.len().saturating_sub(TAIL);
                tail.drain(..excess);
            }
        });
        Self {
            tail,
            forwarder: AbortOnDropHandle::new(forwarder),
        }
    }

    /// Keeps forwarding for the child's whole life (the task ends when the pipe closes):
    /// a child whose stderr nobody reads would block on a full pipe.
    pub(crate) fn detach(self) {
        drop(self.forwarder.detach());
    }

    /// The kept tail, once the pipe is closed (the child exited), waiting at most `within`
    /// for it (a grandchild may hold the pipe open): trimmed, lossily decoded.
    pub(crate) async fn text(mut self, within: Duration) -> String {
        let _ = tokio::time::timeout(within, &mut self.forwarder).await;
        let tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&tail).trim().to_owned()
    }
}
