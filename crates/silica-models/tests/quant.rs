//! Dequantization of GGML blocks: quantize/dequantize round trips with
//! measured error bounds (Q8_0, Q4_0, Q4_1); hand-packed blocks with known
//! scales and quants for the formats without a quantizer (Q5_0, Q5_1, Q4_K,
//! Q5_K, Q6_K), packed by encoders written here from ggml's quantizers;
//! random blocks checked against Python `gguf` (tests/golden/
//! quant_blocks.json, from scripts/gguf_golden.py); and, when
//! SmolLM2-135M-Instruct Q4_1 (`SILICA_TEST_GGUF`, else the built-in default), real tensors against
//! tests/golden/gguf_values.json.

use half::f16;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silica_models::gguf::{GgmlType, GgufFile};
use silica_models::quant::{self, QuantError, dequantize};

/// `n` standard normal values (Box–Muller on a seeded StdRng).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

fn rmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    (sum / a.len() as f64).sqrt()
}

fn round_trip(ty: GgmlType, quantize: fn(&[f32]) -> Vec<u8>, x: &[f32]) -> Vec<f32> {
    let bytes = quantize(x);
    assert_eq!(
        bytes.len(),
        x.len() / ty.block_size().unwrap() * ty.type_size().unwrap()
    );
    dequantize(ty, &bytes, x.len()).unwrap()
}

/// Relative closeness for golden comparisons (absolute near zero).
#[track_caller]
fn close(got: f32, want: f64, what: &str) {
    let tol = 1e-6 * want.abs().max(1e-3);
    assert!(
        (f64::from(got) - want).abs() <= tol,
        "{what}: got {got}, want {want}"
    );
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

// ---------------------------------------------------------------- quantizers

#[test]
fn round_trip_error_on_gaussian_data() {
    let x = gaussian(4096, 7);
    let std = (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 4096.0).sqrt();
    assert!((std - 1.0).abs() < 0.05, "std {std}");
    // Observed RMSE (seed 7, 4096 values, σ = 1): Q8_0 0.00547, Q4_0
    // 0.08681, Q4_1 0.07909. The bounds are about 1.2x those.
    let q8 = rmse(&x, &round_trip(GgmlType::Q8_0, quant::quantize_q8_0, &x));
    let q40 = rmse(&x, &round_trip(GgmlType::Q4_0, quant::quantize_q4_0, &x));
    let q41 = rmse(&x, &round_trip(GgmlType::Q4_1, quant::quantize_q4_1, &x));
    eprintln!("RMSE: Q8_0 {q8:.5}, Q4_0 {q40:.5}, Q4_1 {q41:.5}");
    assert!(q8 <= 0.0066, "Q8_0 RMSE {q8}");
    assert!(q40 <= 0.105, "Q4_0 RMSE {q40}");
    assert!(q41 <= 0.095, "Q4_1 RMSE {q41}");
}

/// The error measure of llama.cpp's `test-quantize-fns` (its
/// `array_rmse`: the root of the summed squared error divided by the
/// count, not by its root) and its bound for 4-bit types and up, 0.002, on
/// 4,096 values: a Gaussian tensor and that test's own data
/// (0.1 + 2 cos i). Plain RMSEs are bounded in
/// `round_trip_error_on_gaussian_data`.
#[test]
fn total_error_within_the_ggml_bound() {
    fn total_error(a: &[f32], b: &[f32]) -> f64 {
        let sum: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum();
        sum.sqrt() / a.len() as f64
    }
    let cosine: Vec<f32> = (0..4096).map(|i| 0.1 + 2.0 * (i as f32).cos()).collect();
    for (data, x) in [("gaussian", gaussian(4096, 11)), ("0.1 + 2 cos i", cosine)] {
        for (ty, quantize) in [
            (
                GgmlType::Q8_0,
                quant::quantize_q8_0 as fn(&[f32]) -> Vec<u8>,
            ),
            (GgmlType::Q4_0, quant::quantize_q4_0),
            (GgmlType::Q4_1, quant::quantize_q4_1),
            (GgmlType::Q4_K, silica_models::kquant::quantize_q4_k),
        ] {
            let err = total_error(&x, &round_trip(ty, quantize, &x));
            eprintln!("{data}: {ty} total error {err:.6}");
            assert!(err <= 0.002, "{data}: {ty} total error {err}");
        }
    }
}

#[test]
fn exactly_representable_blocks_round_trip_exactly() {
    // Q8_0: integers with amax 127 give d = 1.
    let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 255) as f32 - 127.0).collect();
    assert!(x.contains(&-127.0) || x.contains(&127.0));
    assert_eq!(round_trip(GgmlType::Q8_0, quant::quantize_q8_0, &x), x);
    // Q4_0: integers in [-8, 7] with -8 present give d = 1, q = x + 8.
    let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 - 8.0).collect();
    let bytes = quant::quantize_q4_0(&x);
    assert_eq!(&bytes[..2], &f16_bytes(1.0));
    assert_eq!(bytes[2], 0x00, "elements 0 and 16 are both -8");
    assert_eq!(round_trip(GgmlType::Q4_0, quant::quantize_q4_0, &x), x);
    // Q4_1: 0.5 + integers in [0, 15] give d = 1, m = 0.5.
    let x: Vec<f32> = (0..32).map(|i| 0.5 + ((i * 7) % 16) as f32).collect();
    let bytes = quant::quantize_q4_1(&x);
    assert_eq!(
        (&bytes[..2], &bytes[2..4]),
        (&f16_bytes(1.0)[..], &f16_bytes(0.5)[..])
    );
    assert_eq!(bytes[4], 0x00, "elements 0 and 16 are both 0.5");
    assert_eq!(round_trip(GgmlType::Q4_1, quant::quantize_q4_1, &x), x);
    // All-zero blocks: d = 0 and zeros back, no NaN.
    let zeros = vec![0.0; 32];
    for (ty, q) in [
        (
            GgmlType::Q8_0,
            quant::quantize_q8_0 as fn(&[f32]) -> Vec<u8>,
        ),
        (GgmlType::Q4_0, quant::quantize_q4_0),
        (GgmlType::Q4_1, quant::quantize_q4_1),
    ] {
        assert_eq!(round_trip(ty, q, &zeros), zeros, "{ty}");
    }
}

#[test]
#[should_panic(expected = "not a multiple of the block size")]
fn quantizers_want_whole_blocks() {
    quant::quantize_q4_0(&[1.0; 33]);
}

#[test]
fn parallel_and_serial_paths_agree() {
    // 2^17 values take the parallel path; one block at a time, the serial one.
    let x = gaussian(1 << 17, 11);
    for (ty, q) in [
        (
            GgmlType::Q8_0,
            quant::quantize_q8_0 as fn(&[f32]) -> Vec<u8>,
        ),
        (GgmlType::Q4_1, quant::quantize_q4_1),
    ] {
        let bytes = q(&x);
        let serial: Vec<u8> = x.chunks(32).flat_map(q).collect();
        assert_eq!(bytes, serial, "{ty} quantizer");
        let all = dequantize(ty, &bytes, x.len()).unwrap();
        let size = ty.type_size().unwrap();
        let blocks: Vec<f32> = bytes
            .chunks(size)
            .flat_map(|b| dequantize(ty, b, 32).unwrap())
            .collect();
        assert_eq!(all, blocks, "{ty} dequantizer");
    }
}

// ---------------------------------------------------------------- hand-packed blocks

/// 4-bit (or wider) test quants: a spread of values over `0..levels`.
fn quants(n: usize, levels: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 7 + i / 32 * 3 + 1) % levels) as u8)
        .collect()
}

/// A Q5_0 (`m = None`) or Q5_1 block, packed as ggml's
/// `quantize_row_q5_*_ref` does: low nibbles of elements j and j + 16 in
/// qs[j], their fifth bits in bits j and j + 16 of qh.
fn pack_q5(d: f32, m: Option<f32>, q: &[u8]) -> Vec<u8> {
    let mut b = f16_bytes(d).to_vec();
    if let Some(m) = m {
        b.extend_from_slice(&f16_bytes(m));
    }
    let mut qh = 0u32;
    for (i, &v) in q.iter().enumerate() {
        qh |= u32::from(v >> 4) << i;
    }
    b.extend_from_slice(&qh.to_le_bytes());
    b.extend((0..16).map(|j| (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4)));
    b
}

#[test]
fn q5_0_and_q5_1_blocks() {
    let q = quants(32, 32);
    assert!(q.iter().any(|&v| v >= 16) && q.iter().any(|&v| v < 16));
    let y = dequantize(GgmlType::Q5_0, &pack_q5(0.5, None, &q), 32).unwrap();
    let want: Vec<f32> = q.iter().map(|&v| (f32::from(v) - 16.0) * 0.5).collect();
    assert_eq!(y, want);
    let y = dequantize(GgmlType::Q5_1, &pack_q5(0.25, Some(-1.5), &q), 32).unwrap();
    let want: Vec<f32> = q.iter().map(|&v| f32::from(v) * 0.25 - 1.5).collect();
    assert_eq!(y, want);
}

/// The 12 scale bytes of a Q4_K/Q5_K block for 8 six-bit scales and mins,
/// packed as ggml's `quantize_row_q4_K_ref` does.
fn pack_scales_k4(sc: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (sc[j], mins[j]);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    s
}

/// A Q4_K (`with_high = false`, quants < 16) or Q5_K block (quants < 32):
/// element 64c + l in the low nibble of qs[32c + l], element 64c + 32 + l in
/// the high nibble; fifth bits in bits 2c and 2c + 1 of qh[l].
fn pack_k(d: f32, dmin: f32, sc: &[u8; 8], mins: &[u8; 8], q: &[u8], with_high: bool) -> Vec<u8> {
    let mut b = [f16_bytes(d), f16_bytes(dmin)].concat();
    b.extend_from_slice(&pack_scales_k4(sc, mins));
    let mut qh = [0u8; 32];
    let mut qs = [0u8; 128];
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (q[64 * c + l], q[64 * c + 32 + l]);
            qs[32 * c + l] = (lo & 0xF) | ((hi & 0xF) << 4);
            qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
        }
    }
    if with_high {
        b.extend_from_slice(&qh);
    }
    b.extend_from_slice(&qs);
    b
}

const SCALES: [u8; 8] = [1, 17, 33, 63, 5, 40, 2, 60];
const MINS: [u8; 8] = [0, 63, 16, 7, 31, 48, 1, 33];

#[test]
fn q4_k_blocks() {
    // The simplest block: d = 1, dmin = 0, all scales 1: y = q.
    let q = quants(256, 16);
    let y = dequantize(
        GgmlType::Q4_K,
        &pack_k(1.0, 0.0, &[1; 8], &[0; 8], &q, false),
        256,
    )
    .unwrap();
    assert_eq!(y, q.iter().map(|&v| f32::from(v)).collect::<Vec<_>>());
    // Scales and mins over all six bits: y = d * sc * q - dmin * m per 32.
    let b = pack_k(0.25, 0.125, &SCALES, &MINS, &q, false);
    assert_eq!(b.len(), 144);
    let y = dequantize(GgmlType::Q4_K, &b, 256).unwrap();
    for (i, (&got, &v)) in y.iter().zip(&q).enumerate() {
        let (sc, m) = (f32::from(SCALES[i / 32]), f32::from(MINS[i / 32]));
        assert_eq!(got, 0.25 * sc * f32::from(v) - 0.125 * m, "element {i}");
    }
}

#[test]
fn q5_k_blocks() {
    let q = quants(256, 32);
    let b = pack_k(0.5, 0.25, &SCALES, &MINS, &q, true);
    assert_eq!(b.len(), 176);
    let y = dequantize(GgmlType::Q5_K, &b, 256).unwrap();
    for (i, (&got, &v)) in y.iter().zip(&q).enumerate() {
        let (sc, m) = (f32::from(SCALES[i / 32]), f32::from(MINS[i / 32]));
        assert_eq!(got, 0.5 * sc * f32::from(v) - 0.25 * m, "element {i}");
    }
}

#[test]
fn q6_k_blocks() {
    // Quants L in 0..64 stand for L - 32; one signed scale per 16 elements.
    let q = quants(256, 64);
    let sc: Vec<i8> = (0..16).map(|i| (i as i8 - 8) * 9).collect();
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for n in 0..2 {
        let (l0, ql0, qh0) = (128 * n, 64 * n, 32 * n);
        for l in 0..32 {
            let v = |k: usize| q[l0 + l + 32 * k];
            ql[ql0 + l] = (v(0) & 0xF) | ((v(2) & 0xF) << 4);
            ql[ql0 + l + 32] = (v(1) & 0xF) | ((v(3) & 0xF) << 4);
            qh[qh0 + l] =
                (v(0) >> 4) | ((v(1) >> 4) << 2) | ((v(2) >> 4) << 4) | ((v(3) >> 4) << 6);
        }
    }
    let mut b = [&ql[..], &qh[..]].concat();
    b.extend(sc.iter().map(|s| s.to_le_bytes()[0]));
    b.extend_from_slice(&f16_bytes(0.5));
    assert_eq!(b.len(), 210);
    let y = dequantize(GgmlType::Q6_K, &b, 256).unwrap();
    for (i, (&got, &v)) in y.iter().zip(&q).enumerate() {
        let want = 0.5 * f32::from(sc[i / 16]) * (f32::from(v) - 32.0);
        assert_eq!(got, want, "element {i}");
    }
}

#[test]
fn plain_float_types() {
    let x = [1.5f32, -0.0, f32::INFINITY, 3.0e-5];
    let f32s: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(dequantize(GgmlType::F32, &f32s, 4).unwrap(), x);
    let f16s: Vec<u8> = x.iter().flat_map(|&v| f16_bytes(v)).collect();
    let y = dequantize(GgmlType::F16, &f16s, 4).unwrap();
    assert_eq!(y, x.map(|v| f16::from_f32(v).to_f32()));
    let bf16s: Vec<u8> = x
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let y = dequantize(GgmlType::BF16, &bf16s, 4).unwrap();
    assert_eq!(y, x.map(|v| half::bf16::from_f32(v).to_f32()));
}

#[test]
fn errors() {
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q8_K,
        GgmlType::Other(16),
        GgmlType::Other(1000),
    ] {
        assert_eq!(dequantize(ty, &[], 0), Err(QuantError::Unsupported(ty)));
        assert!(!quant::is_supported(ty));
    }
    let e = dequantize(GgmlType::Q4_0, &[0; 18], 16).unwrap_err();
    assert!(
        matches!(e, QuantError::PartialBlock { block: 32, .. }),
        "{e}"
    );
    let e = dequantize(GgmlType::Q4_0, &[0; 19], 32).unwrap_err();
    assert_eq!(e.to_string(), "32 elements of Q4_0 need 18 bytes, got 19");
    assert!(matches!(
        dequantize(GgmlType::F32, &[0; 4], 2),
        Err(QuantError::Length { .. })
    ));
    assert_eq!(dequantize(GgmlType::Q6_K, &[], 0), Ok(vec![]));
}

proptest! {
    /// Arbitrary bytes of every supported type decode without panicking.
    #[test]
    fn arbitrary_blocks_never_panic(raw in prop::collection::vec(any::<u8>(), 0..2048), pick in 0usize..11) {
        use GgmlType::*;
        let ty = [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K][pick];
        let (block, size) = (ty.block_size().unwrap(), ty.type_size().unwrap());
        let n = raw.len() / size;
        let y = dequantize(ty, &raw[..n * size], n * block).unwrap();
        prop_assert_eq!(y.len(), n * block);
    }
}

// ---------------------------------------------------------------- golden values

fn golden(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Random blocks of every supported type, decoded by Python `gguf`: equal
/// bit for bit (the same f32 operations in the same order). JSON holds the
/// f32 values as f64; serde_json may miss the last f64 bit, not the f32.
#[test]
fn random_blocks_match_python_gguf() {
    let g = golden("quant_blocks.json");
    let mut checked = 0;
    for (name, case) in g.as_object().unwrap() {
        let ty = (0..64)
            .map(GgmlType::from_id)
            .find(|t| t.name() == *name)
            .unwrap();
        let want = floats(&case["values"]);
        let got = dequantize(ty, &hex(case["hex"].as_str().unwrap()), want.len()).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w as f32, "{name}[{i}]: got {g}, want {w}");
        }
        checked += 1;
    }
    assert_eq!(checked, 10);
}

/// Real tensors of SmolLM2-135M-Instruct Q4_1 (`SILICA_TEST_GGUF`) against
/// Python `gguf` (tests/golden/gguf_values.json). Without it, the built-in default decoder.
#[test]
fn real_tensors_match_python_gguf() {
    let path = match std::env::var("SILICA_TEST_GGUF") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => {
            silica_models::resolve::resolve_decoder(None).expect("the default decoder resolves")
        }
    };
    let f = GgufFile::open(&path).unwrap();
    let g = golden("gguf_values.json");
    for name in ["blk.0.attn_q.weight", "token_embd.weight"] {
        let want = &g["tensors"][name];
        let info = f.tensor_info(name).unwrap();
        assert_eq!(info.ggml_type.name(), want["type"].as_str().unwrap());
        let dims: Vec<u64> = floats(&want["dims"]).iter().map(|&d| d as u64).collect();
        assert_eq!(info.dims, dims);
        let (shape, values) = f.dequantize(name).unwrap();
        assert_eq!(
            shape,
            dims.iter().rev().map(|&d| d as usize).collect::<Vec<_>>()
        );
        assert_eq!(values.len() as f64, want["numel"].as_f64().unwrap());
        let tail = &values[values.len() - 64..];
        for (i, (&v, w)) in values[..64].iter().zip(floats(&want["first"])).enumerate() {
            close(v, w, &format!("{name} first[{i}]"));
        }
        for (i, (&v, w)) in tail.iter().zip(floats(&want["last"])).enumerate() {
            close(v, w, &format!("{name} last[{i}]"));
        }
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let want_sum = want["sum"].as_f64().unwrap();
        assert!(
            (sum - want_sum).abs() <= 1e-6 * want_sum.abs(),
            "{name} sum {sum} vs {want_sum}"
        );
    }
}
