//! The `subagent/end` events of one parent's children, as a channel of child ids: the
//! continuable benches wait on it for settlement.

use subagents::{EventScope, Runtime, SessionId, SubagentEvent, Subscription};
use tokio::sync::mpsc;

/// Every child of `parent` whose epoch ends is sent on the receiver, while the subscription
/// lives.
pub fn ended_children(
    rt: &Runtime,
    parent: SessionId,
) -> (mpsc::UnboundedReceiver<SessionId>, Subscription) {
    let (sender, ended) = mpsc::unbounded_channel();
    let subscription =
        rt.subagents()
            .events()
            .subscribe(EventScope::Key(parent), move |event: &SubagentEvent| {
                if let SubagentEvent::End(end) = event {
                    let _ = sender.send(end.info.id);
                }
            });
    (ended, subscription)
}
