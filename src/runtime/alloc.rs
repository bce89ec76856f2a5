//! The binary's allocator (and the load benchmark's P0m): mimalloc through its C library.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The binary's allocator: mimalloc instead of glibc malloc, fewer cycles per request on the
/// proxy path (docs/benchmarks/history.md, tuning step 1).
///
/// mimalloc's plain entry points for every alignment up to 8 bytes (nearly every allocation a
/// request makes), its aligned ones above. The `mimalloc` crate's allocator calls the aligned
/// ones always; they check the alignment of the block they would hand out and fall back to a
/// slower path when it is not aligned: about 30 instructions more per allocation, some 95
/// allocations a request, 2.6 % of the gateway's instructions (step 12).
pub struct MiMalloc;

/// Every block mimalloc hands out is aligned to at least a machine word: its size classes are
/// whole words, and a page's first block is aligned to 16 bytes (`MI_PAGE_MIN_START_BLOCK_ALIGN`
/// in its sources). The test below holds it to that.
const PLAIN_ALIGN: usize = 8;

// SAFETY: each method forwards to the mimalloc function of the same contract. For
// `align <= PLAIN_ALIGN` the plain functions return blocks aligned to at least 8 bytes (see
// `PLAIN_ALIGN`), so `layout`'s alignment is met; above it the aligned functions take the
// alignment. mimalloc returns null on failure, as `GlobalAlloc` requires, and `mi_free` and the
// reallocs accept any block from either family.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size a request makes (and larger), at every alignment, are aligned and
    /// keep their bytes through reallocation, from both families of entry points.
    #[test]
    fn blocks_are_aligned_and_reallocs_keep_their_bytes() {
        let a = MiMalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in (1..=1024).chain([4095, 4096, 65_536, 1 << 20]) {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xa5, size);
                    let q = a.realloc(p, layout, size * 3);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "realloc: size {size} align {align}");
                    assert!(
                        (0..size).all(|i| *q.add(i) == 0xa5),
                        "size {size} align {align}"
                    );
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
