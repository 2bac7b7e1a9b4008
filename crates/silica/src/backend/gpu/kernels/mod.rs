//! The WGSL kernels and their launchers: one `<family>.rs` beside the
//! `.wgsl` files of its kernels (each with an entry point), and in
//! `shared/` the fragments that kernels are assembled from (`common.wgsl`
//! first in every kernel: element loads and stores for each dtype).
//!
//! Every tensor buffer is bound to kernels as `array<u32>` whatever its
//! dtype; `common.wgsl` converts elements to and from f32, in which all
//! kernels compute. 16-bit elements sit two to a word, so a kernel thread
//! writes whole words (two 16-bit elements) to avoid races between threads.

pub(crate) mod copy;
pub(crate) mod elementwise;
pub(crate) mod launch;
pub(crate) mod matmul;
pub(crate) mod nn;
pub(crate) mod qmatmul;
pub(crate) mod reduce;

use super::{Context, Kernel, KernelNeeds};
