//! `subagents tree`: prints the durable forest of delegated children in a store, from its
//! headers and logs alone (nothing is loaded or resumed), so it works on a store another
//! process wrote, including one that was killed mid-turn.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use subagents::store::SharedStore;
use subagents::{
    CancellationToken, ErrorCode, Runtime, SessionId, SubagentDescendantListEntry, SubagentError,
    SubagentForestEntry, SubagentListEntry,
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

/// Runs the command, writing to `out` as the listing streams: the forest's entries are
/// printed as they are identified, not gathered first.
pub(crate) async fn run(args: TreeArgs, out: &mut impl Write) -> Result<(), super::super::Failure> {
    // Kept until the command ends: the copy a read-only store is listed from.
    let (store, _copy) = open_for_listing(&args.store).await?;
    let rt = Runtime::builder()
        .shared_store(Arc::clone(&store))
        .build()?;
    let printed = print_forest(&rt, &store, &args, out).await;
    // Shut down whatever the printing did (a closed output stops it early).
    let shutdown = rt.shutdown().await;
    printed?;
    shutdown?;
    Ok(())
}

/// Lists the asked-for tree, or every tree of the store, into `out`.
async fn print_forest(
    rt: &Runtime,
    store: &SharedStore,
    args: &TreeArgs,
    out: &mut impl Write,
) -> Result<(), super::super::Failure> {
    let mut printer = ForestPrinter::new(out, args.json);
    // Each branch reads what can fail before it prints anything.
    match args.root {
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
            printer.begin()?;
            printer.root(root)?;
            for entry in &descendants {
                printer.entry(entry)?;
            }
        }
        // One read of the store for every root; only roots with delegated children.
        None => {
            let mut entries = rt
                .subagents()
                .stream_forest(CancellationToken::new())
                .await?;
            printer.begin()?;
            while let Some(SubagentForestEntry { root, entry }) = entries.try_next().await? {
                if printer.current_root() != Some(root) {
                    printer.root(root)?;
                }
                printer.entry(&entry)?;
            }
        }
    }
    printer.finish(&args.store)?;
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

/// Prints a forest as its entries arrive: an indented tree, or JSON of one shape whether or
/// not a root was asked for (a list of roots, each with its descendants in pre-order, an empty
/// list for a root with none), one entry a line.
struct ForestPrinter<'a, W: Write> {
    out: &'a mut W,
    json: bool,
    /// The root being printed, and how many of its entries were.
    current: Option<(SessionId, usize)>,
    /// Whether any root was printed.
    any: bool,
}

impl<'a, W: Write> ForestPrinter<'a, W> {
    fn new(out: &'a mut W, json: bool) -> Self {
        Self {
            out,
            json,
            current: None,
            any: false,
        }
    }

    fn current_root(&self) -> Option<SessionId> {
        self.current.map(|(root, _)| root)
    }

    fn begin(&mut self) -> std::io::Result<()> {
        if self.json {
            write!(self.out, "[")?;
        }
        Ok(())
    }

    fn root(&mut self, root: SessionId) -> std::io::Result<()> {
        self.end_root()?;
        if self.json {
            let separator = if self.any { "," } else { "" };
            write!(
                self.out,
                "{separator}\n  {{\"root\": {}, \"descendants\": [",
                serde_json::to_string(&root)?
            )?;
        } else {
            writeln!(self.out, "{root}")?;
        }
        self.current = Some((root, 0));
        self.any = true;
        Ok(())
    }

    fn entry(&mut self, row: &SubagentDescendantListEntry) -> std::io::Result<()> {
        let printed = match &mut self.current {
            Some((_, printed)) => printed,
            None => return Ok(()),
        };
        if self.json {
            let separator = if *printed > 0 { "," } else { "" };
            write!(self.out, "{separator}\n    {}", serde_json::to_string(row)?)?;
        } else {
            let indent = "  ".repeat(usize::try_from(row.depth).unwrap_or(usize::MAX).min(64));
            writeln!(self.out, "{indent}{}", describe(&row.entry))?;
        }
        *printed += 1;
        Ok(())
    }

    fn end_root(&mut self) -> std::io::Result<()> {
        match self.current.take() {
            Some((_, printed)) if self.json => {
                if printed > 0 {
                    write!(self.out, "\n  ]}}")
                } else {
                    write!(self.out, "]}}")
                }
            }
            Some((_, 0)) => writeln!(self.out, "  (no delegated children)"),
            _ => Ok(()),
        }
    }

    fn finish(&mut self, store: &StoreLocation) -> std::io::Result<()> {
        self.end_root()?;
        if self.json {
            if self.any {
                writeln!(self.out, "\n]")
            } else {
                writeln!(self.out, "]")
            }
        } else if !self.any {
            writeln!(self.out, "no delegated children in {store}")
        } else {
            Ok(())
        }
    }
}
