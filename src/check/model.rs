//! Provides [`CheckModel`]: the model a history-checker schedule talks to. It answers `done`
//! after a latency drawn from the schedule's seed, the calling session and its history length,
//! and holds a turn whose last user message carries a hold marker (`[hold N]`) until the
//! schedule releases gate `N`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};

use crate::content::{MessageSource, Role};
use crate::load::mix;
use crate::model::scripted::text_chunks;
use crate::model::{FinishReason, GenerateRequest, LlmAdapter, StreamChunk};
use crate::session::LlmFailure;
use crate::testing::Gate;

/// The marker that holds a turn at gate `gate`.
pub(crate) fn hold_marker(gate: usize) -> String {
    format!("[hold {gate}]")
}

/// The checker's model. Clones share the gates.
#[derive(Clone)]
pub(crate) struct CheckModel {
    seed: u64,
    /// The most latency a call draws, in microseconds.
    max_latency_us: u64,
    gates: Arc<Mutex<BTreeMap<usize, Gate>>>,
}

impl CheckModel {
    pub(crate) fn new(seed: u64, max_latency: Duration) -> Self {
        Self {
            seed,
            max_latency_us: u64::try_from(max_latency.as_micros()).unwrap_or(u64::MAX),
            gates: Arc::default(),
        }
    }

    fn gates(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Gate>> {
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new gate; its number goes into a message as [`hold_marker`].
    pub(crate) fn new_gate(&self) -> usize {
        let mut gates = self.gates();
        let number = gates.len();
        gates.insert(number, Gate::new());
        number
    }

    /// How many gates were made.
    pub(crate) fn gate_count(&self) -> usize {
        self.gates().len()
    }

    /// Releases gate `number` (and every turn held there, now and later).
    pub(crate) fn release(&self, number: usize) {
        if let Some(gate) = self.gates().get(&number) {
            gate.release();
        }
    }

    /// Releases every gate.
    pub(crate) fn release_all(&self) {
        for gate in self.gates().values() {
            gate.release();
        }
    }

    fn delay(&self, request: &GenerateRequest) -> Duration {
        if self.max_latency_us == 0 {
            return Duration::ZERO;
        }
        let session = request.session_id.map_or(0, |id| {
            u64::from_le_bytes(id.as_bytes()[..8].try_into().unwrap_or_default())
        });
        let position = u64::try_from(request.messages.len()).unwrap_or(u64::MAX);
        let draw = mix(self.seed ^ mix(session ^ mix(position)));
        Duration::from_micros(draw % (self.max_latency_us + 1))
    }

    /// The gate the request's last user message asks to be held at.
    fn held_at(&self, request: &GenerateRequest) -> Option<Gate> {
        let last = request
            .messages
            .messages()
            .rev()
            .find(|message| !matches!(message.source, MessageSource::Plugin { .. }))
            .filter(|message| message.role == Role::User)?;
        let text = last.text();
        let start = text.find("[hold ")? + "[hold ".len();
        let number: usize = text[start..].split(']').next()?.trim().parse().ok()?;
        self.gates().get(&number).cloned()
    }
}

impl LlmAdapter for CheckModel {
    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
        let delay = self.delay(&request);
        let gate = self.held_at(&request);
        let cancel = request.cancel.clone();
        stream::once(async move {
            let waited = async {
                if let Some(gate) = gate {
                    gate.pass().await;
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            };
            tokio::select! {
                () = waited => Ok(text_chunks("done".to_owned(), FinishReason::Stop)),
                () = cancel.cancelled() => {
                    Err(LlmFailure::new("ABORTED", "the turn was cancelled"))
                }
            }
        })
        .map(|answered| match answered {
            Ok(chunks) => stream::iter(chunks.into_iter().map(Ok)).boxed(),
            Err(failure) => stream::once(async move { Err(failure) }).boxed(),
        })
        .flatten()
        .boxed()
    }
}
