//! A parent's node watching the nodes its children were placed on: a node that stopped (or was
//! restarted under its id) sends those children's settled notices no more, so their parents
//! hear `node-stopped` from here.

use super::*;

/// How often a parent's node looks for stopped nodes among those its children were placed on.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl ContinuationManager {
    /// Looks for stopped nodes every [`SWEEP_EVERY`] from now on, unless it already does.
    pub(super) fn watch_gone_nodes(&mut self, ctx: &mut Context<Self>) {
        if self.sweep.is_none() {
            self.sweep = Some(ctx.run_interval(SWEEP_EVERY, |manager, ctx| {
                manager.sweep_gone_nodes(ctx);
            }));
        }
    }

    /// Starts a look for stopped nodes among those holding this runtime's placed children
    /// (one at a time, and only while there are such children).
    fn sweep_gone_nodes(&mut self, ctx: &mut Context<Self>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        if self.sweeping {
            return;
        }
        let mut nodes: Vec<NodeId> = self
            .remote_children
            .values()
            .map(|record| record.node)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        self.sweeping = true;
        let manager = ctx.address();
        tokio::spawn(async move {
            match cluster.live_incarnations(&nodes).await {
                Ok(live) => manager.do_send(NodesLive(live)),
                Err(error) => {
                    tracing::debug!(%error, "looking for stopped nodes failed");
                    manager.do_send(NodesLive(
                        nodes.into_iter().map(|node| (node, None)).collect(),
                    ));
                }
            }
        });
    }
}

/// Internal: the live incarnation of each node still live among those holding placed
/// children; the children placed on any other node, or on another incarnation of a live one
/// (it was restarted under its id), will send no notice.
#[derive(Message)]
#[rtype(result = "()")]
struct NodesLive(std::collections::HashMap<NodeId, Option<uuid::Uuid>>);

impl Handler<NodesLive> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: NodesLive, ctx: &mut Context<Self>) {
        self.sweeping = false;
        let stopped = |record: &RemoteChild| match msg.0.get(&record.node) {
            None => true,
            Some(live) => record.held_by_predecessor_of(*live),
        };
        let mut lost: Vec<(SessionId, NodeId, AgentRef)> = self
            .remote_children
            .iter()
            // A start still in flight answers its own caller (it fails, and nothing settled).
            .filter(|(_, record)| record.starting.is_none() && stopped(record))
            .map(|(child, record)| (*child, record.node, record.parent.clone()))
            .collect();
        lost.sort_unstable_by_key(|(child, ..)| *child);
        for (child, node, parent) in lost {
            self.announce_node_stopped(child, node, &parent, ctx);
            self.forget_remote(child, node, ctx);
        }
    }
}

impl ContinuationManager {
    /// A placed child's epoch ended with its node (it stopped, or was restarted under its
    /// id): its parent hears that it settled, `node-stopped` (a follow-up resumes it from its
    /// last durable event).
    pub(super) fn announce_node_stopped(
        &mut self,
        child: SessionId,
        node: NodeId,
        parent: &AgentRef,
        ctx: &mut Context<Self>,
    ) {
        tracing::warn!(%child, %node, "a placed child's node stopped; its parent is told it settled");
        // What it accepted there and did not run waits in its log: the next follow-up runs it,
        // a drain of its lineage discards it.
        self.parked.insert(child, parent.clone());
        let ended = self.remote_children.get(&child).map_or(
            NodeIncarnation {
                node,
                incarnation: None,
            },
            RemoteChild::holder,
        );
        self.ended_with_node.insert(child, ended);
        let reason = crate::stop_reason::StopReason::Other("node-stopped".into());
        let (content, source) = settled_notice(child, &reason, None, None);
        let message = Message::user(content, source);
        let delivery =
            self.post_settled_notice(child, parent, message, false, SentFrom::default(), ctx);
        tokio::spawn(delivery);
    }
}
