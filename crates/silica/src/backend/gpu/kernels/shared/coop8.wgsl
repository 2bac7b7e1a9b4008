// coop8.wgsl — the fragment shape of the cooperative-matrix kernels on
// Apple GPUs through Metal, whose simdgroup matrices are 8x8 only: f16
// operands, f32 accumulators (Metal's mixed-precision configuration).
const FRAG: u32 = 8u;
alias FragA = coop_mat8x8<f16, A>;
alias FragB = coop_mat8x8<f16, B>;
alias FragC = coop_mat8x8<f32, C>;
