//! The library's settings: every `SILICA_*` environment variable it honours
//! is read here, once per process, into [`GpuOptions`] and a few
//! process-wide values; code can set the same things without the
//! environment (`Device::gpu_with_options`, `GpuDevice::set_strict`,
//! [`crate::set_cpu_int8_activations`]). `docs/environment.md` lists them.

use std::sync::OnceLock;

/// Dispatches recorded before the pending batch is submitted without
/// waiting, once the GPU has work queued: a decode step fits in one batch
/// (docs/tuning.md, "Submission batch size"). After the GPU went idle,
/// batches start at [`DEFAULT_FIRST_BATCH`] and double up to this.
pub const DEFAULT_SUBMIT_EVERY: u32 = 256;

/// Most dispatches in one submitted batch (the profiling query set holds
/// two timestamps for each).
pub const MAX_SUBMIT_EVERY: u32 = 1024;

/// Dispatches in the first batch after the GPU was found idle (a read-back
/// or a wait that left nothing running); each batch after it may hold
/// twice as many, up to [`GpuOptions::submit_every`], so that an idle GPU
/// starts on a prompt while the host still records it (docs/tuning.md,
/// "First batches after an idle GPU").
pub const DEFAULT_FIRST_BATCH: u32 = 32;

/// Rows of x up to which a quantized product takes the GEMV kernels (in
/// chunks of at most 8 rows) rather than the tiled ones: short prompts and
/// a server's steps of many sequences (docs/tuning.md, "GEMV chunks").
pub const DEFAULT_GEMV_ROWS: u32 = 64;

/// Fewest rows [`GpuOptions::gemv_rows`] takes: products of up to 8 rows
/// always take the GEMV kernels.
pub const MIN_GEMV_ROWS: u32 = 8;

/// Most rows [`GpuOptions::gemv_rows`] takes.
pub const MAX_GEMV_ROWS: u32 = 256;

/// Parts of K a quantized product may be split into on the
/// cooperative-matrix kernel, so that a narrow product (few 128x128 tiles:
/// a short prompt, a server's step of many sequences) keeps a large GPU's
/// SMs busy (docs/tuning.md, "Split K").
pub const DEFAULT_SPLIT_K: u32 = 8;

/// Most parts [`GpuOptions::split_k`] takes.
pub const MAX_SPLIT_K: u32 = 16;

/// Rows of f16 x from which a quantized product takes the
/// cooperative-matrix kernel where the adapter has it (and the GEMV kernels
/// below; docs/tuning.md, "Narrow products on tensor cores").
pub const DEFAULT_COOP_ROWS: u32 = 16;

/// Fewest rows [`GpuOptions::coop_rows`] takes (up to 8 rows always take
/// the GEMV kernels).
pub const MIN_COOP_ROWS: u32 = 9;

/// Most rows [`GpuOptions::coop_rows`] takes: from 64 rows on, the
/// cooperative-matrix kernel takes every f16 product.
pub const MAX_COOP_ROWS: u32 = 64;

/// Rows of f16 x from which a quantized product decodes its weights into
/// f16 once and multiplies them on the f16 tensor-core kernels, where the
/// adapter has them (docs/tuning.md, "Weights decoded for long prompts").
pub const DEFAULT_DECODED_ROWS: u32 = 256;

/// Fewest rows [`GpuOptions::decoded_rows`] takes besides 0 (off): the f16
/// kernels take tensor cores from 64 rows on.
pub const MIN_DECODED_ROWS: u32 = 64;

/// Fewest rows [`GpuOptions::keep_decoded`] takes besides 0 (off): up to 8
/// rows, one GEMV chunk reads the quantized weights, a quarter of the f16
/// bytes or less.
pub const MIN_KEPT_ROWS: u32 = 9;

/// How a GPU device is opened. [`GpuOptions::from_env`] gives the
/// process's settings (what `Device::gpu` uses); [`Default`] gives every
/// feature the adapter offers, whatever the environment says.
///
/// The switches only take features away or override a default chosen by
/// adapter: a feature the adapter lacks stays off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuOptions {
    /// Cooperative-matrix (tensor-core) kernels where the adapter has them.
    /// `SILICA_NO_COOP=1` turns them off.
    pub cooperative_matrix: bool,
    /// Reductions through subgroup operations where the adapter has them.
    /// `SILICA_NO_SUBGROUPS=1` keeps them in workgroup memory.
    pub subgroups: bool,
    /// Kernel parameters as immediate data (push constants) where they fit.
    /// `SILICA_NO_IMMEDIATES=1` puts them in uniform buffers.
    pub immediates: bool,
    /// Host-mapped tensor buffers on unified-memory adapters (no staging
    /// copies). `SILICA_NO_MAPPED=1` turns it off.
    pub mapped_buffers: bool,
    /// Whether decode's quantized products round x to 8 bits and take
    /// integer dot products: `None` decides by adapter (on through Vulkan
    /// on hardware GPUs), `Some` forces it. `SILICA_INTEGER_GEMV=1` or `0`.
    pub integer_gemv: Option<bool>,
    /// Dispatches recorded before a batch is submitted, 1 to
    /// [`MAX_SUBMIT_EVERY`]. `SILICA_SUBMIT_EVERY=N`.
    pub submit_every: u32,
    /// Dispatches in the first batch after the GPU was found idle, 1 to
    /// [`MAX_SUBMIT_EVERY`] (batches then double up to `submit_every`).
    /// `SILICA_FIRST_BATCH=N`.
    pub first_batch: u32,
    /// Rows of x up to which quantized products may take the GEMV kernels,
    /// [`MIN_GEMV_ROWS`] to [`MAX_GEMV_ROWS`]. `SILICA_GEMV_ROWS=N`.
    pub gemv_rows: u32,
    /// Most parts of K a quantized product of many rows is split into on
    /// the cooperative-matrix kernel, 1 (no split) to [`MAX_SPLIT_K`].
    /// `SILICA_SPLIT_K=N`.
    pub split_k: u32,
    /// Rows of f16 x from which quantized products take the
    /// cooperative-matrix kernel, [`MIN_COOP_ROWS`] to [`MAX_COOP_ROWS`].
    /// `SILICA_COOP_ROWS=N`.
    pub coop_rows: u32,
    /// Quantized products of 16 to 32 rows of f16 x in the 32-value block
    /// formats take qmatmul_narrow.wgsl (16-row tensor-core tiles, a
    /// subgroup each) where the adapter has cooperative matrices and
    /// subgroup barriers, and f16 products of 9 to 16 rows by a weight
    /// `[n, k]` take matmul_narrow.wgsl. `SILICA_NO_NARROW=1` keeps the
    /// 128-row tiles and the GEMV chunks.
    pub narrow_kernel: bool,
    /// Rows of f16 x from which a quantized product's weights are decoded
    /// into f16 once and multiplied on the f16 tensor-core kernels: 0 (off)
    /// or at least [`MIN_DECODED_ROWS`]. `SILICA_DECODED_ROWS=N`.
    pub decoded_rows: u32,
    /// Rows of f16 x from which a quantized product multiplies an f16 copy
    /// of its weights, decoded at its first such product and kept as long
    /// as the weights (2 bytes a weight beside the quantized ones): 0 (off,
    /// the default) or at least [`MIN_KEPT_ROWS`]. A server's steps of many
    /// sequences and short prompts then read f16 weights on the f16 kernels
    /// instead of decoding blocks in every product. `SILICA_KEEP_DECODED=N`.
    pub keep_decoded: u32,
    /// A missing kernel is an error instead of a CPU fallback.
    /// `SILICA_STRICT=1`.
    pub strict: bool,
    /// Every GPU op is also run on the CPU and compared. `SILICA_CHECK=1`.
    pub check: bool,
    /// Every dispatch is timed from the start. `SILICA_PROFILE=1`.
    pub profile: bool,
    /// The driver's compiled pipelines are kept under
    /// [`cache_dir`]`/pipelines` where the backend allows it (Vulkan), and
    /// reused by the next process. `SILICA_NO_PIPELINE_CACHE=1` turns it off.
    pub pipeline_cache: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            cooperative_matrix: true,
            subgroups: true,
            immediates: true,
            mapped_buffers: true,
            integer_gemv: None,
            submit_every: DEFAULT_SUBMIT_EVERY,
            first_batch: DEFAULT_FIRST_BATCH,
            gemv_rows: DEFAULT_GEMV_ROWS,
            split_k: DEFAULT_SPLIT_K,
            coop_rows: DEFAULT_COOP_ROWS,
            narrow_kernel: true,
            decoded_rows: DEFAULT_DECODED_ROWS,
            keep_decoded: 0,
            strict: false,
            check: false,
            profile: false,
            pipeline_cache: true,
        }
    }
}

impl GpuOptions {
    /// The options the environment sets, read once per process.
    pub fn from_env() -> GpuOptions {
        static ENV: OnceLock<GpuOptions> = OnceLock::new();
        ENV.get_or_init(|| Self::read(|name| std::env::var(name).ok()))
            .clone()
    }

    /// The options set by the variables `get` returns.
    fn read(get: impl Fn(&str) -> Option<String>) -> GpuOptions {
        let on = |name: &str| get(name).is_some_and(|v| flag(&v));
        // a whole number clamped to its range; the default when unset or unreadable
        let number = |name: &str, default: u32, lo: u32, hi: u32| {
            get(name)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(default)
                .clamp(lo, hi)
        };
        let d = GpuOptions::default();
        GpuOptions {
            cooperative_matrix: !on("SILICA_NO_COOP"),
            subgroups: !on("SILICA_NO_SUBGROUPS"),
            immediates: !on("SILICA_NO_IMMEDIATES"),
            mapped_buffers: !on("SILICA_NO_MAPPED"),
            integer_gemv: get("SILICA_INTEGER_GEMV")
                .filter(|v| !v.trim().is_empty())
                .map(|v| flag(&v)),
            submit_every: number("SILICA_SUBMIT_EVERY", d.submit_every, 1, MAX_SUBMIT_EVERY),
            first_batch: number("SILICA_FIRST_BATCH", d.first_batch, 1, MAX_SUBMIT_EVERY),
            gemv_rows: number(
                "SILICA_GEMV_ROWS",
                d.gemv_rows,
                MIN_GEMV_ROWS,
                MAX_GEMV_ROWS,
            ),
            split_k: number("SILICA_SPLIT_K", d.split_k, 1, MAX_SPLIT_K),
            coop_rows: number(
                "SILICA_COOP_ROWS",
                d.coop_rows,
                MIN_COOP_ROWS,
                MAX_COOP_ROWS,
            ),
            narrow_kernel: !on("SILICA_NO_NARROW"),
            decoded_rows: match number("SILICA_DECODED_ROWS", d.decoded_rows, 0, u32::MAX) {
                0 => 0,
                n => n.max(MIN_DECODED_ROWS),
            },
            keep_decoded: match number("SILICA_KEEP_DECODED", d.keep_decoded, 0, u32::MAX) {
                0 => 0,
                n => n.max(MIN_KEPT_ROWS),
            },
            strict: on("SILICA_STRICT"),
            check: on("SILICA_CHECK"),
            profile: on("SILICA_PROFILE"),
            pipeline_cache: !on("SILICA_NO_PIPELINE_CACHE"),
        }
    }
}

/// Whether a variable's value means "on": anything but empty, `0`,
/// `false` and `off`.
fn flag(v: &str) -> bool {
    !matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "" | "0" | "false" | "off"
    )
}

/// silica's cache folder: `$SILICA_CACHE`, else `$XDG_CACHE_HOME/silica`,
/// else `~/.cache/silica` (models, pipeline caches).
pub fn cache_dir() -> std::path::PathBuf {
    use std::path::PathBuf;
    let var = |v: &str| std::env::var_os(v).filter(|d| !d.is_empty());
    if let Some(d) = var("SILICA_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("silica");
    }
    let home = var("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("silica")
}

/// `SILICA_DEVICE`, when set and not blank: the default device's selector.
pub fn device_selector() -> Option<String> {
    std::env::var("SILICA_DEVICE")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// Whether the CPU starts with 8-bit activations (see
/// [`crate::cpu_int8_activations`]): unless `SILICA_CPU_INT8` is off.
pub(crate) fn cpu_int8_from_env() -> bool {
    std::env::var("SILICA_CPU_INT8").map_or(true, |v| flag(&v) || v.trim().is_empty())
}

/// `SILICA_CPU_ISA`, when set and not blank: the CPU's instruction set
/// (see [`crate::cpu_isa`]).
pub(crate) fn cpu_isa_from_env() -> Option<String> {
    std::env::var("SILICA_CPU_ISA")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// Whether adapter discovery includes OpenGL: only when asked for, by
/// `WGPU_BACKEND` naming it or `SILICA_DEVICE` selecting it, because
/// probing Mesa's GL driver without a display prints errors, and GL
/// adapters lack the f16 and subgroups the fast kernels need.
pub(crate) fn probe_gl() -> bool {
    let wgpu_gl = std::env::var("WGPU_BACKEND").is_ok_and(|v| {
        v.split(',').any(|b| {
            matches!(
                b.trim().to_ascii_lowercase().as_str(),
                "gl" | "gles" | "opengl"
            )
        })
    });
    let selected = device_selector().is_some_and(|s| {
        matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "gl" | "gles" | "opengl"
        )
    });
    wgpu_gl || selected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(vars: &[(&str, &str)]) -> GpuOptions {
        GpuOptions::read(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn no_variables_give_the_defaults() {
        assert_eq!(options(&[]), GpuOptions::default());
    }

    #[test]
    fn each_variable_sets_its_field() {
        let o = options(&[
            ("SILICA_NO_COOP", "1"),
            ("SILICA_NO_SUBGROUPS", "true"),
            ("SILICA_NO_IMMEDIATES", "1"),
            ("SILICA_NO_MAPPED", "yes"),
            ("SILICA_INTEGER_GEMV", "0"),
            ("SILICA_SUBMIT_EVERY", " 32 "),
            ("SILICA_FIRST_BATCH", "8"),
            ("SILICA_GEMV_ROWS", "16"),
            ("SILICA_SPLIT_K", "2"),
            ("SILICA_COOP_ROWS", "32"),
            ("SILICA_STRICT", "1"),
            ("SILICA_CHECK", "on"),
            ("SILICA_PROFILE", "1"),
            ("SILICA_NO_PIPELINE_CACHE", "1"),
            ("SILICA_NO_NARROW", "1"),
            ("SILICA_DECODED_ROWS", "0"),
            ("SILICA_KEEP_DECODED", "4"),
        ]);
        let want = GpuOptions {
            cooperative_matrix: false,
            subgroups: false,
            immediates: false,
            mapped_buffers: false,
            integer_gemv: Some(false),
            submit_every: 32,
            first_batch: 8,
            gemv_rows: 16,
            split_k: 2,
            coop_rows: 32,
            narrow_kernel: false,
            decoded_rows: 0,
            keep_decoded: MIN_KEPT_ROWS,
            strict: true,
            check: true,
            profile: true,
            pipeline_cache: false,
        };
        assert_eq!(o, want);
        assert_eq!(
            options(&[("SILICA_INTEGER_GEMV", "1")]).integer_gemv,
            Some(true)
        );
    }

    #[test]
    fn off_values_and_bad_numbers_keep_the_defaults() {
        let o = options(&[
            ("SILICA_NO_COOP", "0"),
            ("SILICA_NO_SUBGROUPS", "false"),
            ("SILICA_NO_MAPPED", "OFF"),
            ("SILICA_INTEGER_GEMV", " "),
            ("SILICA_SUBMIT_EVERY", "many"),
            ("SILICA_CHECK", ""),
        ]);
        assert_eq!(o, GpuOptions::default());
        let clamp = |v: &str| options(&[("SILICA_SUBMIT_EVERY", v)]).submit_every;
        assert_eq!(clamp("0"), 1);
        assert_eq!(clamp("100000"), MAX_SUBMIT_EVERY);
        let rows = |v: &str| options(&[("SILICA_GEMV_ROWS", v)]).gemv_rows;
        assert_eq!(rows("0"), MIN_GEMV_ROWS);
        assert_eq!(rows("x"), DEFAULT_GEMV_ROWS);
        assert_eq!(rows("100000"), MAX_GEMV_ROWS);
        let coop = |v: &str| options(&[("SILICA_COOP_ROWS", v)]).coop_rows;
        assert_eq!(coop("1"), MIN_COOP_ROWS);
        assert_eq!(coop(""), DEFAULT_COOP_ROWS);
        assert_eq!(coop("1000"), MAX_COOP_ROWS);
    }
}
