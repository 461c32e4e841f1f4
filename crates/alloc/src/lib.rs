//! The gateway's global allocator: mimalloc, asked for a plain block (`mi_malloc`) whenever a
//! plain block is aligned enough, and for an aligned one only when the layout needs more.
//!
//! The `mimalloc` crate's allocator passes every layout to `mi_malloc_aligned`. In mimalloc v3
//! that call takes a fast path only for blocks up to 1 KiB; a larger block whose size is not a
//! power of two (a boxed request future, a header map's entries) goes through its generic
//! path and is over-allocated by its alignment, with an interior pointer its free must
//! undo, even when the alignment is 8, which every mimalloc block has. The s1 request path
//! makes several such allocations per request; `benches/e2e/instructions.py` counts what
//! they cost. This crate holds the process's only `unsafe` code, allowed on the one impl that
//! must be.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

/// The alignment of every block mimalloc hands out: its blocks are whole machine words from a
/// word-aligned page start.
const WORD: usize = core::mem::size_of::<usize>();

/// Whether a plain block of `layout.size()` bytes is aligned enough for `layout`: a word, and
/// no more than the size (a block smaller than its alignment is a corner mimalloc's aligned
/// call handles).
#[inline]
fn plain_fits(layout: &Layout) -> bool {
    layout.align() <= WORD && layout.align() <= layout.size()
}

/// mimalloc, with plain blocks for word-aligned layouts.
pub struct Mimalloc;

// SAFETY: every method forwards to mimalloc's allocation functions, which return either null
// or a block of at least the requested size; a plain block is only returned for a layout
// `plain_fits` (word alignment, which every mimalloc block has), and every other layout gets
// mimalloc's aligned call. `dealloc` and `realloc` receive blocks this allocator returned,
// and `mi_free` / `mi_realloc*` accept any mimalloc block, aligned or plain.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain_fits(&layout) {
            libmimalloc_sys::mi_malloc(layout.size()).cast()
        } else {
            libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain_fits(&layout) {
            libmimalloc_sys::mi_zalloc(layout.size()).cast()
        } else {
            libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        libmimalloc_sys::mi_free(ptr.cast::<c_void>());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = Layout::from_size_align_unchecked(new_size, layout.align());
        if plain_fits(&new) {
            libmimalloc_sys::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
        } else {
            libmimalloc_sys::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align())
                .cast()
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    /// Every size up to 20 KiB (the sizes around mimalloc's 1 KiB small-block limit and its
    /// page sizes densely), every alignment up to 4 KiB: the block is aligned, writable over
    /// its whole length, grows and shrinks in place or moved with its contents, and is freed.
    #[test]
    fn blocks_are_aligned_and_keep_their_contents() {
        let sizes = (1..=2100).chain((2100..20_000).step_by(97));
        for size in sizes {
            for align in (0..=12).map(|s| 1usize << s) {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero-sized layout; the block is written within its size,
                // reallocated with its own layout and freed once.
                unsafe {
                    let p = Mimalloc.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    p.write_bytes(0xA5, size);
                    let grown = Mimalloc.realloc(p, layout, size * 2);
                    assert_eq!(grown as usize % align, 0, "grown {size} align {align}");
                    assert!((0..size).all(|i| *grown.add(i) == 0xA5));
                    let layout2 = Layout::from_size_align(size * 2, align).unwrap();
                    let shrunk = Mimalloc.realloc(grown, layout2, size.div_ceil(2));
                    assert_eq!(shrunk as usize % align, 0, "shrunk {size} align {align}");
                    assert!((0..size.div_ceil(2)).all(|i| *shrunk.add(i) == 0xA5));
                    let layout3 = Layout::from_size_align(size.div_ceil(2), align).unwrap();
                    Mimalloc.dealloc(shrunk, layout3);

                    let z = Mimalloc.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed {size} align {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    Mimalloc.dealloc(z, layout);
                }
            }
        }
    }

    #[test]
    fn plain_blocks_only_for_word_alignment_within_the_size() {
        let fits = |size, align| plain_fits(&Layout::from_size_align(size, align).unwrap());
        assert!(fits(8, 8));
        assert!(fits(5000, 8));
        assert!(fits(3, 2));
        assert!(!fits(4, 8));
        assert!(!fits(5000, 16));
        assert!(!fits(5000, 128));
    }
}
