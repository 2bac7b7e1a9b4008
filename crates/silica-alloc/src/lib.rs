//! The allocator of the `silica` tool, for the programs that should
//! allocate as it does: its examples that time what it does, the Python
//! extension module, and any program that runs models on the CPU.
//!
//! Linking this crate makes mimalloc the program's global allocator; a
//! program takes it by calling [`keep_freed_pages`] at start (which also
//! makes the crate a linked dependency).

/// mimalloc instead of the system allocator: recording a decode step
/// allocates and frees many small objects (tensors, wgpu's pass commands),
/// and glibc's allocator spent a sixth of that time consolidating its free
/// lists when a pass's command list grew; on the CPU, glibc maps a
/// prompt's large intermediates afresh for each op, and the kernel zeroes
/// their pages.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_decommits` option (its index in `mi_option_t`, the
/// same in mimalloc 2 and 3), which the sys crate does not name.
const MI_OPTION_PURGE_DECOMMITS: libmimalloc_sys::mi_option_t = 5;

/// Memory mimalloc purges (freed and unused for 10 ms) is reset, not
/// decommitted: the OS takes it back only when it needs it, so that a
/// prompt's intermediates, freed and allocated again a layer later, do not
/// come back as fresh pages for the kernel to zero (docs/tuning.md, "CPU
/// memory reuse").
pub fn keep_freed_pages() {
    // SAFETY: sets an option; mimalloc reads it at each purge
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DECOMMITS, 0) };
}
