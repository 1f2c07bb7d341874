//! Provides the translation of `chat.completion.chunk` objects into stream chunks.

use super::*;

/// A `chat.completion.chunk` (only the fields the adapter reads; all optional, nulls allowed).
#[derive(Deserialize)]
pub(super) struct ChunkBody {
    pub(super) choices: Option<Vec<ChoiceBody>>,
    pub(super) usage: Option<UsageBody>,
    pub(super) error: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct ChoiceBody {
    pub(super) index: Option<u64>,
    pub(super) delta: Option<DeltaBody>,
    pub(super) finish_reason: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct DeltaBody {
    pub(super) content: Option<String>,
    pub(super) reasoning_content: Option<String>,
    pub(super) reasoning: Option<String>,
    pub(super) tool_calls: Option<Vec<ToolCallBody>>,
}

#[derive(Deserialize)]
pub(super) struct ToolCallBody {
    pub(super) index: Option<u64>,
    pub(super) id: Option<String>,
    pub(super) function: Option<FunctionBody>,
}

#[derive(Deserialize)]
pub(super) struct FunctionBody {
    pub(super) name: Option<String>,
    pub(super) arguments: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct UsageBody {
    pub(super) prompt_tokens: Option<u64>,
    pub(super) completion_tokens: Option<u64>,
    pub(super) prompt_tokens_details: Option<PromptDetails>,
    pub(super) completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
pub(super) struct PromptDetails {
    pub(super) cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct CompletionDetails {
    pub(super) reasoning_tokens: Option<u64>,
}

impl UsageBody {
    /// Disjoint counts: cached prompt tokens and reasoning tokens are split out.
    pub(super) fn token_usage(&self) -> TokenUsage {
        let cache_read = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|details| details.cached_tokens);
        let reasoning = self
            .completion_tokens_details
            .as_ref()
            .and_then(|details| details.reasoning_tokens);
        TokenUsage {
            input_tokens: self
                .prompt_tokens
                .unwrap_or(0)
                .saturating_sub(cache_read.unwrap_or(0)),
            output_tokens: self
                .completion_tokens
                .unwrap_or(0)
                .saturating_sub(reasoning.unwrap_or(0)),
            cache_read,
            cache_write: None,
            reasoning,
        }
    }
}

/// Maps a provider `finish_reason`.
pub(super) fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "length" => FinishReason::MaxTokens,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::Refusal,
        _ => FinishReason::Stop,
    }
}

/// Which text-like block a delta extends.
#[derive(Clone, Copy)]
pub(super) enum TextKind {
    Text,
    Reasoning,
}

/// A text or reasoning block being streamed.
pub(super) struct TextBlock {
    pub(super) index: u32,
    pub(super) text: String,
}

/// A tool call being streamed.
pub(super) struct CallBlock {
    pub(super) index: u32,
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// Turns the deltas of one response into chunks, numbering blocks as they first appear.
#[derive(Default)]
pub(super) struct Assembly {
    pub(super) next_index: u32,
    pub(super) reasoning: Option<TextBlock>,
    pub(super) text: Option<TextBlock>,
    /// Tool calls by the provider's call index.
    pub(super) calls: BTreeMap<u64, CallBlock>,
    /// The provider index of the call the last delta extended.
    pub(super) last_call: Option<u64>,
    pub(super) finish: Option<FinishReason>,
}

impl Assembly {
    /// Whether the provider sent a `finish_reason`.
    pub(super) fn finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Applies one chunk object, queuing what it yields.
    pub(super) fn apply(
        &mut self,
        chunk: ChunkBody,
        out: &mut VecDeque<StreamChunk>,
    ) -> std::result::Result<(), LlmFailure> {
        if let Some(error) = chunk.error.filter(|error| !error.is_null()) {
            let detail = ProviderError::from_error(&error);
            let (code, category) = if detail.is_quota() {
                (codes::INSUFFICIENT_QUOTA, FailureCategory::Quota)
            } else {
                (codes::PROVIDER_ERROR, FailureCategory::Provider)
            };
            let message = detail
                .message
                .unwrap_or_else(|| "the provider reported an error mid-stream".to_owned());
            return Err(failure(
                code,
                Some(category),
                format!("the model provider failed mid-stream: {message}"),
            ));
        }
        if let Some(usage) = &chunk.usage {
            out.push_back(StreamChunk::Usage {
                usage: usage.token_usage(),
            });
        }
        let choice = chunk
            .choices
            .unwrap_or_default()
            .into_iter()
            .find(|choice| choice.index.unwrap_or(0) == 0);
        let Some(choice) = choice else {
            return Ok(());
        };
        if let Some(delta) = choice.delta {
            let reasoning = [delta.reasoning_content, delta.reasoning]
                .into_iter()
                .flatten()
                .find(|text| !text.is_empty());
            if let Some(text) = reasoning {
                self.append_text(TextKind::Reasoning, text, out)?;
            }
            if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                self.append_text(TextKind::Text, text, out)?;
            }
            for call in delta.tool_calls.unwrap_or_default() {
                self.append_call(call, out)?;
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.finish = Some(finish_reason(&reason));
        }
        Ok(())
    }

    /// Ends the response: every block's `block-end` in index order, then `finish` when the
    /// provider sent a reason.
    pub(super) fn close(&mut self, out: &mut VecDeque<StreamChunk>) {
        let mut blocks: Vec<(u32, ContentBlock)> = Vec::new();
        if let Some(block) = self.reasoning.take() {
            blocks.push((block.index, ContentBlock::Reasoning { text: block.text }));
        }
        if let Some(block) = self.text.take() {
            blocks.push((block.index, ContentBlock::Text { text: block.text }));
        }
        for call in std::mem::take(&mut self.calls).into_values() {
            let id = if call.id.is_empty() {
                fallback_call_id(call.index)
            } else {
                CallId::new(call.id)
            };
            blocks.push((
                call.index,
                ContentBlock::ToolCall {
                    id,
                    name: call.name,
                    arguments: call.arguments,
                },
            ));
        }
        blocks.sort_by_key(|(index, _)| *index);
        out.extend(
            blocks
                .into_iter()
                .map(|(index, block)| StreamChunk::BlockEnd { index, block }),
        );
        if let Some(reason) = self.finish.take() {
            out.push_back(StreamChunk::Finish { reason });
        }
    }

    /// The next block index.
    pub(super) fn open(&mut self) -> std::result::Result<u32, LlmFailure> {
        let index = self.next_index;
        self.next_index = index
            .checked_add(1)
            .ok_or_else(|| protocol("the response has too many blocks"))?;
        Ok(index)
    }

    pub(super) fn slot(&mut self, kind: TextKind) -> &mut Option<TextBlock> {
        match kind {
            TextKind::Text => &mut self.text,
            TextKind::Reasoning => &mut self.reasoning,
        }
    }

    /// Extends the text or reasoning block, opening it first if needed.
    pub(super) fn append_text(
        &mut self,
        kind: TextKind,
        text: String,
        out: &mut VecDeque<StreamChunk>,
    ) -> std::result::Result<(), LlmFailure> {
        let existing = self.slot(kind).as_ref().map(|block| block.index);
        let index = match existing {
            Some(index) => index,
            None => {
                let index = self.open()?;
                let block_type = match kind {
                    TextKind::Text => BlockType::Text,
                    TextKind::Reasoning => BlockType::Reasoning,
                };
                out.push_back(StreamChunk::BlockStart { index, block_type });
                *self.slot(kind) = Some(TextBlock {
                    index,
                    text: String::new(),
                });
                index
            }
        };
        if let Some(block) = self.slot(kind).as_mut() {
            block.text.push_str(&text);
        }
        out.push_back(match kind {
            TextKind::Text => StreamChunk::TextDelta { index, text },
            TextKind::Reasoning => StreamChunk::ReasoningDelta { index, text },
        });
        Ok(())
    }

    /// Extends a tool call, opening it first if needed.
    pub(super) fn append_call(
        &mut self,
        call: ToolCallBody,
        out: &mut VecDeque<StreamChunk>,
    ) -> std::result::Result<(), LlmFailure> {
        let id = call.id.unwrap_or_default();
        let (name, arguments) = call
            .function
            .map(|function| {
                (
                    function.name.unwrap_or_default(),
                    function.arguments.unwrap_or_default(),
                )
            })
            .unwrap_or_default();
        let key = self.call_key(call.index, &id);
        let existing = self.calls.get(&key).map(|block| block.index);
        let index = match existing {
            Some(index) => index,
            None => {
                let index = self.open()?;
                out.push_back(StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::ToolCall,
                });
                self.calls.insert(
                    key,
                    CallBlock {
                        index,
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    },
                );
                index
            }
        };
        if let Some(block) = self.calls.get_mut(&key) {
            if block.id.is_empty() {
                block.id.clone_from(&id);
            }
            if block.name.is_empty() {
                block.name.clone_from(&name);
            }
            block.arguments.push_str(&arguments);
        }
        self.last_call = Some(key);
        let carries_news = !id.is_empty() || !name.is_empty() || !arguments.is_empty();
        if carries_news {
            out.push_back(StreamChunk::ToolCallDelta {
                index,
                id,
                name: (!name.is_empty()).then_some(name),
                arguments_delta: arguments,
            });
        }
        Ok(())
    }

    /// The provider index of a call delta; a provider that omits the index continues the last
    /// call unless the delta brings a new id.
    pub(super) fn call_key(&self, index: Option<u64>, id: &str) -> u64 {
        if let Some(index) = index {
            return index;
        }
        let last = self
            .last_call
            .and_then(|key| self.calls.get(&key).map(|block| (key, block)));
        match last {
            Some((key, block)) if id.is_empty() || block.id == id => key,
            _ => self
                .calls
                .keys()
                .next_back()
                .map_or(0, |key| key.saturating_add(1)),
        }
    }
}
