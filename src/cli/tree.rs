//! `subagents tree`: prints the durable forest of delegated children in a store, from its
//! headers and logs alone (nothing is loaded or resumed), so it works on a store another
//! process wrote, including one that was killed mid-turn.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use subagents::store::SharedStore;
use subagents::{
    CancellationToken, ErrorCode, Runtime, SessionId, SubagentDescendantListEntry, SubagentError,
    SubagentForestTree, SubagentListEntry,
};

use super::store::StoreLocation;

/// The `tree` command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct TreeArgs {
    /// The session whose descendants to print; every root session of the store when omitted.
    root: Option<SessionId>,
    /// The store: a sled directory, or a `postgres://` URL.
    #[arg(long, default_value = super::store::DEFAULT_STORE)]
    store: StoreLocation,
    /// Print JSON for scripts instead of an indented tree: a list of roots, each with its
    /// descendants in pre-order.
    #[arg(long)]
    json: bool,
}

/// Runs the command, writing to `out`.
pub(crate) async fn run(args: TreeArgs, out: &mut impl Write) -> Result<(), super::super::Failure> {
    // Kept until the command ends: the copy a read-only store is listed from.
    let (store, _copy) = open_for_listing(&args.store).await?;
    let rt = Runtime::builder()
        .shared_store(Arc::clone(&store))
        .build()?;
    let trees = match args.root {
        Some(root) => {
            let descendants = rt
                .subagents()
                .list_descendants(root, CancellationToken::new())
                .await?;
            // An unknown root is a mistake worth saying, not an empty tree (a parent that
            // never ran a turn has no header, but its children name it).
            if descendants.is_empty() && store.header(root).await.is_err() {
                return Err(SubagentError::new(
                    ErrorCode::SessionNotFound,
                    format!("session {root} is not in the store at {}", args.store),
                )
                .into());
            }
            vec![SubagentForestTree { root, descendants }]
        }
        // One read of the store for every root; only roots with delegated children.
        None => rt.subagents().list_forest(CancellationToken::new()).await?,
    };
    rt.shutdown().await?;
    if args.json {
        print_json(&trees, out)?;
    } else {
        print_text(&trees, &args, out)?;
    }
    Ok(())
}

/// Opens the store to list it. sled writes as it opens (its lock, its recovery), so a sled
/// directory this process may not write (another user's, a read-only mount) is copied to a
/// temporary directory and the copy is listed, with a note on stderr; the copy is returned for
/// the caller to keep until it is done.
async fn open_for_listing(
    location: &StoreLocation,
) -> Result<(SharedStore, Option<tempfile::TempDir>), SubagentError> {
    let StoreLocation::Sled(dir) = location else {
        return Ok((location.open_to_read().await?, None));
    };
    if !dir.is_dir() || is_writable(dir) {
        return Ok((location.open_to_read().await?, None));
    }
    let copy = tempfile::Builder::new()
        .prefix("subagents-tree-")
        .tempdir()
        .map_err(|error| {
            SubagentError::new(
                ErrorCode::StoreIo,
                format!("a temporary directory: {error}"),
            )
        })?;
    copy_dir(dir, copy.path()).map_err(|error| {
        SubagentError::new(
            ErrorCode::StoreIo,
            format!(
                "the store at {} cannot be written here, and copying it to list the copy failed: {error}",
                dir.display()
            ),
        )
    })?;
    let _ = writeln!(
        std::io::stderr(),
        "note: the store at {} cannot be written here (sled writes as it opens): listing a copy",
        dir.display()
    );
    let store = StoreLocation::Sled(copy.path().to_owned())
        .open_to_read()
        .await?;
    Ok((store, Some(copy)))
}

/// Whether this process may create files in `dir`.
fn is_writable(dir: &Path) -> bool {
    tempfile::tempfile_in(dir).is_ok()
}

/// Copies the files of `from` (and of its subdirectories) into `to`, writable by this process
/// (a copy keeps its original's read-only mode, which sled could not open).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir(&target)?;
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

fn describe(entry: &SubagentListEntry) -> String {
    match entry {
        SubagentListEntry::Child {
            id,
            mode,
            label,
            activity,
            ..
        } => {
            let activity = serde_json::to_value(activity).unwrap_or_default();
            // Columns aligned: the widest mode is `continuable`, the widest activity `inactive`.
            let mut line = format!(
                "{id}  {:<11}  {:<8}",
                mode.as_str(),
                activity.as_str().unwrap_or("")
            );
            if let Some(label) = label {
                line.push_str(&format!("  {label:?}"));
            }
            line.trim_end().to_owned()
        }
        SubagentListEntry::Diagnostic { id, reason } => {
            let reason = serde_json::to_value(reason).unwrap_or_default();
            format!("{id}  [diagnostic: {}]", reason.as_str().unwrap_or(""))
        }
    }
}

fn print_text(
    trees: &[SubagentForestTree],
    args: &TreeArgs,
    out: &mut impl Write,
) -> std::io::Result<()> {
    if trees.is_empty() {
        writeln!(out, "no delegated children in {}", args.store)?;
    }
    for tree in trees {
        writeln!(out, "{}", tree.root)?;
        if tree.descendants.is_empty() {
            writeln!(out, "  (no delegated children)")?;
        }
        for row in &tree.descendants {
            let indent = "  ".repeat(usize::try_from(row.depth).unwrap_or(usize::MAX).min(64));
            writeln!(out, "{indent}{}", describe(&row.entry))?;
        }
    }
    Ok(())
}

/// One shape whether or not a root was asked for: a list of roots, each with its descendants
/// (an empty list for a root with none).
fn print_json(trees: &[SubagentForestTree], out: &mut impl Write) -> std::io::Result<()> {
    /// One printed root, serialized from the listing as it is (no JSON tree built first).
    #[derive(serde::Serialize)]
    struct Root<'a> {
        root: SessionId,
        descendants: &'a [SubagentDescendantListEntry],
    }
    let roots: Vec<Root<'_>> = trees
        .iter()
        .map(|tree| Root {
            root: tree.root,
            descendants: &tree.descendants,
        })
        .collect();
    serde_json::to_writer_pretty(&mut *out, &roots)?;
    writeln!(out)
}
