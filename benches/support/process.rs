//! Sets this bench process up as the `subagents` binary sets itself up, so figures compare.

/// Transparent huge pages off, as `subagents` turns them off at start (see its
/// `without_transparent_huge_pages`): with them on, the kernel re-zeroes 2 MiB pages under
/// mimalloc, and a figure would measure that instead of the runtime.
pub fn like_the_binary() {
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}
