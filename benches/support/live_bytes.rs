//! A global allocator that counts the heap bytes live at any moment, over mimalloc (the
//! allocator the `subagents` binary runs on). RSS includes the allocator's own reserve and
//! fragmentation, and moves in pages; the live count is exact to within [`SLACK`] a thread, so
//! a change to what one child holds shows up in it over a few thousand children.
//!
//! # Why a thread counts on its own first
//! Every allocation and free once added to one shared counter (and raised a shared peak): on
//! two threads that cache line moved between the cores at every call, and the drain of 100,000
//! resident children on two workers spent about a fifth of its time there, so the figure
//! measured the counter as much as the runtime. A thread now keeps its own running difference
//! and adds it to the shared count only once it has drifted [`SLACK`] bytes either way.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// mimalloc, counting.
pub struct Counting;

/// How far one thread's uncounted difference may drift before it is added to [`LIVE`]: what
/// [`live_bytes`] may be off by, per thread that allocates (a thread that exits leaves at most
/// this much uncounted).
pub const SLACK: isize = 16 * 1024;

/// The published heap bytes: signed, since a block one thread allocated may be freed, and
/// published, by another first.
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The most heap bytes published live at once since the last [`reset_peak`].
static PEAK: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// This thread's difference not yet added to [`LIVE`]. Const, and with nothing to drop,
    /// so reaching it never allocates (the allocator itself reads it).
    static UNPUBLISHED: Cell<isize> = const { Cell::new(0) };
}

/// The heap bytes allocated and not yet freed (to within [`SLACK`] a thread).
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed).max(0).unsigned_abs()
}

/// The most heap bytes live at once since the last [`reset_peak`] (to within [`SLACK`] a
/// thread).
#[allow(dead_code)]
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed).max(0).unsigned_abs()
}

/// Starts a new peak from what is live now.
#[allow(dead_code)]
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Counts `delta` bytes more (or fewer) live: on this thread, publishing once it has drifted
/// [`SLACK`] bytes.
fn counted(delta: isize) {
    let due = UNPUBLISHED.try_with(|unpublished| {
        let pending = unpublished.get() + delta;
        if pending.abs() < SLACK {
            unpublished.set(pending);
            0
        } else {
            unpublished.set(0);
            pending
        }
    });
    // A thread past its thread-locals' teardown publishes at once.
    let due = due.unwrap_or(delta);
    if due != 0 {
        let live = LIVE.fetch_add(due, Ordering::Relaxed) + due;
        if due > 0 {
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
    }
}

/// `size` as a signed difference (an allocation's size always fits: a `Layout` is at most
/// `isize::MAX` bytes).
fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// SAFETY: every call forwards to mimalloc unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(signed(layout.size()));
        // SAFETY: the caller upholds `alloc`'s contract, which is mimalloc's.
        unsafe { crate::allocator::MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(signed(layout.size()));
        // SAFETY: as for `alloc`.
        unsafe { crate::allocator::MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        counted(-signed(layout.size()));
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { crate::allocator::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        let moved = unsafe { crate::allocator::MiMalloc.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            counted(signed(new_size) - signed(layout.size()));
        }
        moved
    }
}
