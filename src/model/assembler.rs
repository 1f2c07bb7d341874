//! Provides [`BlockAssembler`]: folds stream chunks into content blocks, ordered by block index.

use std::collections::BTreeMap;

use crate::content::ContentBlock;
use crate::ids::CallId;
use crate::model::{fallback_call_id, BlockType, StreamChunk};

/// Folds chunks into blocks. A `block-end` chunk is authoritative and replaces what the deltas
/// built.
#[derive(Debug, Default)]
pub struct BlockAssembler {
    blocks: BTreeMap<u32, Partial>,
}

#[derive(Debug)]
enum Partial {
    Text(String),
    Reasoning(String),
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    Done(ContentBlock),
}

impl BlockAssembler {
    /// An empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; usage and finish chunks are ignored here.
    pub fn push(&mut self, chunk: &StreamChunk) {
        match chunk {
            StreamChunk::BlockStart { index, block_type } => {
                self.blocks
                    .entry(*index)
                    .or_insert_with(|| match block_type {
                        BlockType::Text => Partial::Text(String::new()),
                        BlockType::Reasoning => Partial::Reasoning(String::new()),
                        BlockType::ToolCall => Partial::ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                        },
                    });
            }
            StreamChunk::TextDelta { index, text } => {
                if let Partial::Text(buffer) = self
                    .blocks
                    .entry(*index)
                    .or_insert_with(|| Partial::Text(String::new()))
                {
                    buffer.push_str(text);
                }
            }
            StreamChunk::ReasoningDelta { index, text } => {
                if let Partial::Reasoning(buffer) = self
                    .blocks
                    .entry(*index)
                    .or_insert_with(|| Partial::Reasoning(String::new()))
                {
                    buffer.push_str(text);
                }
            }
            StreamChunk::ToolCallDelta {
                index,
                id: delta_id,
                name: delta_name,
                arguments_delta,
            } => {
                let entry = self
                    .blocks
                    .entry(*index)
                    .or_insert_with(|| Partial::ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                if let Partial::ToolCall {
                    id,
                    name,
                    arguments,
                } = entry
                {
                    if id.is_empty() {
                        id.push_str(delta_id);
                    }
                    if let Some(delta_name) = delta_name {
                        if name.is_empty() {
                            name.push_str(delta_name);
                        }
                    }
                    arguments.push_str(arguments_delta);
                }
            }
            StreamChunk::BlockEnd { index, block } => {
                self.blocks.insert(*index, Partial::Done(block.clone()));
            }
            StreamChunk::Usage { .. } | StreamChunk::Finish { .. } => {}
        }
    }

    /// Whether non-blank text or reasoning has streamed (what an interrupted message keeps).
    pub fn has_visible_text(&self) -> bool {
        self.blocks.values().any(|partial| match partial {
            Partial::Text(text) | Partial::Reasoning(text) => !text.trim().is_empty(),
            Partial::Done(ContentBlock::Text { text } | ContentBlock::Reasoning { text }) => {
                !text.trim().is_empty()
            }
            _ => false,
        })
    }

    /// The assembled blocks in index order; empty text blocks are left out.
    ///
    /// Tool-call ids are normalized so each call of one response has a distinct, non-empty id
    /// (the log pairs results with calls by id): a missing id becomes `call-<index>`, a repeated
    /// one gets `-<index>` appended.
    pub fn blocks(&self) -> Vec<ContentBlock> {
        let mut seen = std::collections::HashSet::new();
        let mut unique_id = |index: u32, id: &str| {
            let mut id = if id.is_empty() {
                fallback_call_id(index)
            } else {
                CallId::new(id)
            };
            if !seen.insert(id.clone()) {
                id = CallId::new(format!("{id}-{index}"));
                seen.insert(id.clone());
            }
            id
        };
        self.blocks
            .iter()
            .filter_map(|(index, partial)| match partial {
                Partial::Text(text) if !text.is_empty() => Some(ContentBlock::text(text.clone())),
                Partial::Reasoning(text) if !text.is_empty() => {
                    Some(ContentBlock::Reasoning { text: text.clone() })
                }
                Partial::Text(_) | Partial::Reasoning(_) => None,
                Partial::ToolCall {
                    id,
                    name,
                    arguments,
                } => Some(ContentBlock::ToolCall {
                    id: unique_id(*index, id),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                Partial::Done(ContentBlock::ToolCall {
                    id,
                    name,
                    arguments,
                }) => Some(ContentBlock::ToolCall {
                    id: unique_id(*index, id.as_str()),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                Partial::Done(block) => Some(block.clone()),
            })
            .collect()
    }

    /// The blocks without tool calls (a max-tokens or interrupted response keeps only text).
    pub fn text_blocks(&self) -> Vec<ContentBlock> {
        self.blocks()
            .into_iter()
            .filter(|block| !matches!(block, ContentBlock::ToolCall { .. }))
            .collect()
    }
}
