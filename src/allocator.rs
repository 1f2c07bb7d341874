//! Provides [`MiMalloc`]: mimalloc as the global allocator, asking it for a plain block whenever
//! a plain block is aligned enough (the binary's allocator, and the benches', which include this
//! file).
//!
//! # Why
//! The `mimalloc` crate's allocator asks for an aligned block on every call
//! (`mi_malloc_aligned`). mimalloc v3 serves one from its fast path only when the size class's
//! page has a free block at hand, and otherwise only when the class's blocks are a power of two;
//! every other request is over-allocated from a larger class. Under `callgrind` on the drain of
//! 5,000 resident children, 15% of allocations took that path and allocating cost 72
//! instructions a call. A plain `mi_malloc` block is 16-byte aligned from 16 bytes on (8-byte
//! below), as `malloc`'s is, so the same rule as the standard library's `System` applies.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The alignment every plain mimalloc block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// mimalloc, plain where plain blocks are aligned enough.
pub struct MiMalloc;

/// Whether a plain block of `size` bytes is aligned to `align`: smaller blocks are aligned to
/// their power-of-two size class, so an alignment at most the size (and 16) holds.
fn plain(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every call forwards to mimalloc with the layout's size, asking for its alignment
// unless a plain block has it (see `plain`); blocks from either are freed by `mi_free`.
unsafe impl GlobalAlloc for MiMalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: mimalloc's allocation calls take any size and a power-of-two alignment.
        unsafe {
            if plain(size, align) {
                mi_malloc(size).cast()
            } else {
                mi_malloc_aligned(size, align).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: as for `alloc`.
        unsafe {
            if plain(size, align) {
                mi_zalloc(size).cast()
            } else {
                mi_zalloc_aligned(size, align).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        // SAFETY: `ptr` came from this allocator with `layout`; the moved block keeps the
        // alignment the layout asks for.
        unsafe {
            if plain(new_size, align) {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, align).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    // Paths, not a glob import: the benches include this file, and build without its tests.
    /// Every block is aligned as its layout asks, through allocation, zeroing and growth.
    #[test]
    fn blocks_are_aligned_as_their_layouts_ask() {
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [1, 3, 8, 12, 16, 24, 40, 48, 72, 100, 1000, 5000, 70_000] {
                let layout = std::alloc::Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each block is freed with its layout.
                unsafe {
                    use std::alloc::GlobalAlloc as _;
                    let block = super::MiMalloc.alloc(layout);
                    assert_eq!(block as usize % align, 0, "{size} bytes aligned to {align}");
                    let zeroed = super::MiMalloc.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0);
                    assert!(std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|b| *b == 0));
                    let grown = super::MiMalloc.realloc(block, layout, size * 3);
                    assert_eq!(
                        grown as usize % align,
                        0,
                        "{size} bytes grown, aligned to {align}"
                    );
                    super::MiMalloc.dealloc(
                        grown,
                        std::alloc::Layout::from_size_align(size * 3, align).unwrap(),
                    );
                    super::MiMalloc.dealloc(zeroed, layout);
                }
            }
        }
    }
}
