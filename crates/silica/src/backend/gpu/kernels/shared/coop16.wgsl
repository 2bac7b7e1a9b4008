// coop16.wgsl — the fragment shape of the cooperative-matrix kernels on
// NVIDIA through Vulkan: 16x16 f16 operands, f32 accumulators.
const FRAG: u32 = 16u;
alias FragA = coop_mat16x16<f16, A>;
alias FragB = coop_mat16x16<f16, B>;
alias FragC = coop_mat16x16<f32, C>;
