//! The GGUF reader: files built in memory by a small writer are parsed back
//! field by field; each defensive rule has a test that breaks it and checks
//! the error names the byte offset and the problem; every prefix of a valid
//! file and random mutations give errors, never panics. A last test reads a
//! real model (`SILICA_TEST_GGUF`, else the built-in default decoder).

use proptest::prelude::*;
use silica_models::Error;
use silica_models::gguf::{GgmlType, GgufFile, MetaValue};
use silica_models::quant;

// ---------------------------------------------------------------- writer

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    put_u64(b, s.len() as u64);
    b.extend_from_slice(s);
}

/// A value's GGUF type id and encoding (arrays take their element type from
/// their first element; empty ones are u8 arrays).
fn encode(v: &MetaValue) -> (u32, Vec<u8>) {
    use MetaValue::*;
    match v {
        U8(x) => (0, vec![*x]),
        I8(x) => (1, x.to_le_bytes().to_vec()),
        U16(x) => (2, x.to_le_bytes().to_vec()),
        I16(x) => (3, x.to_le_bytes().to_vec()),
        U32(x) => (4, x.to_le_bytes().to_vec()),
        I32(x) => (5, x.to_le_bytes().to_vec()),
        F32(x) => (6, x.to_le_bytes().to_vec()),
        Bool(x) => (7, vec![u8::from(*x)]),
        String(x) => (
            8,
            [&(x.len() as u64).to_le_bytes()[..], x.as_bytes()].concat(),
        ),
        U64(x) => (10, x.to_le_bytes().to_vec()),
        I64(x) => (11, x.to_le_bytes().to_vec()),
        F64(x) => (12, x.to_le_bytes().to_vec()),
        Array(items) => {
            let items: Vec<_> = items.iter().map(encode).collect();
            let mut b = le(&[items.first().map_or(0, |e| e.0)], &[items.len() as u64]);
            items.iter().for_each(|e| b.extend_from_slice(&e.1));
            (9, b)
        }
    }
}

/// A metadata pair: a value, or raw bytes (key, type and value) to break
/// things with.
enum Kv {
    Val(&'static str, MetaValue),
    Raw(Vec<u8>),
}

struct Tensor {
    name: Vec<u8>,
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
    /// Offset relative to the data section; `None`: the next aligned one.
    offset: Option<u64>,
}

fn tensor(name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Tensor {
    Tensor {
        name: name.as_bytes().to_vec(),
        dims: dims.to_vec(),
        ty: ty.id(),
        data,
        offset: None,
    }
}

struct Gguf {
    version: u32,
    /// The alignment used for layout (write `general.alignment` to match).
    align: u64,
    kvs: Vec<Kv>,
    tensors: Vec<Tensor>,
}

/// A written file and where things are in it.
struct Built {
    bytes: Vec<u8>,
    /// Offset of each metadata key.
    kv_at: Vec<usize>,
    /// Offsets of each tensor info (its name) and of its n_dims, type and
    /// data-offset fields.
    info_at: Vec<usize>,
    n_dims_at: Vec<usize>,
    type_at: Vec<usize>,
    offset_at: Vec<usize>,
    /// End of the tensor infos (a file without tensors may end there).
    info_end: usize,
    data_start: usize,
    /// Each tensor's offset relative to the data section.
    rel: Vec<usize>,
}

impl Gguf {
    fn build(&self) -> Built {
        let mut b = b"GGUF".to_vec();
        put_u32(&mut b, self.version);
        put_u64(&mut b, self.tensors.len() as u64);
        put_u64(&mut b, self.kvs.len() as u64);
        let mut kv_at = vec![];
        for kv in &self.kvs {
            kv_at.push(b.len());
            match kv {
                Kv::Val(key, v) => {
                    let (ty, value) = encode(v);
                    put_str(&mut b, key.as_bytes());
                    put_u32(&mut b, ty);
                    b.extend_from_slice(&value);
                }
                Kv::Raw(raw) => b.extend_from_slice(raw),
            }
        }
        let (mut info_at, mut n_dims_at, mut type_at, mut offset_at) =
            (vec![], vec![], vec![], vec![]);
        let (mut rel, mut next) = (vec![], 0u64);
        for t in &self.tensors {
            info_at.push(b.len());
            put_str(&mut b, &t.name);
            n_dims_at.push(b.len());
            put_u32(&mut b, t.dims.len() as u32);
            t.dims.iter().for_each(|&d| put_u64(&mut b, d));
            type_at.push(b.len());
            put_u32(&mut b, t.ty);
            offset_at.push(b.len());
            let offset = t.offset.unwrap_or(next);
            put_u64(&mut b, offset);
            rel.push(offset as usize);
            let end = offset.checked_add(t.data.len() as u64).unwrap_or(0);
            next = end.checked_next_multiple_of(self.align).unwrap_or(0);
        }
        let info_end = b.len();
        let data_start = b.len().next_multiple_of(self.align as usize);
        b.resize(data_start, 0);
        // No padding after the last tensor: every proper prefix is invalid.
        for (t, &off) in self.tensors.iter().zip(&rel) {
            if !t.data.is_empty() {
                let start = data_start + off;
                let end = start + t.data.len();
                b.resize(b.len().max(end), 0);
                b[start..end].copy_from_slice(&t.data);
            }
        }
        Built {
            bytes: b,
            kv_at,
            info_at,
            n_dims_at,
            type_at,
            offset_at,
            info_end,
            data_start,
            rel,
        }
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37).sin()).collect()
}

/// Metadata with every value type, nested arrays and odd strings.
fn all_kvs() -> Vec<Kv> {
    use MetaValue::*;
    let nest = |v: MetaValue| Array(vec![v]);
    let s = |s: &str| String(s.into());
    vec![
        Kv::Val("general.architecture", s("llama")),
        Kv::Val("t.u8", U8(200)),
        Kv::Val("t.i8", I8(-100)),
        Kv::Val("t.u16", U16(60000)),
        Kv::Val("t.i16", I16(-30000)),
        Kv::Val("t.u32", U32(4_000_000_000)),
        Kv::Val("t.i32", I32(-2_000_000_000)),
        Kv::Val("t.f32", F32(1.5e-3)),
        Kv::Val("t.true", Bool(true)),
        Kv::Val("t.false", Bool(false)),
        Kv::Val("t.str", s("héllo ✓ \0 end")),
        Kv::Val("", s("")),
        Kv::Val("t.u64", U64(u64::MAX)),
        Kv::Val("t.i64", I64(i64::MIN)),
        Kv::Val("t.f64", F64(-2.5e300)),
        Kv::Val("t.arr.u32", Array(vec![U32(1), U32(2), U32(3)])),
        Kv::Val("t.arr.str", Array(vec![s("a"), s(""), s("ü")])),
        Kv::Val("t.arr.empty", Array(vec![])),
        Kv::Val(
            "t.arr.nested",
            Array(vec![Array(vec![I16(-1), I16(2)]), nest(I16(3))]),
        ),
        Kv::Val(
            "t.arr.depth4",
            nest(nest(nest(Array(vec![F64(0.5), F64(-1.5)])))),
        ),
    ]
}

/// A small valid file: all value types, a custom alignment, four tensors.
fn sample() -> Gguf {
    let mut kvs = all_kvs();
    kvs.push(Kv::Val("general.alignment", MetaValue::U32(64)));
    let f16s = [1.0f32, -2.0, 0.5, 65504.0].map(|v| half::f16::from_f32(v).to_le_bytes());
    let (q8, q4) = (
        quant::quantize_q8_0(&ramp(128)),
        quant::quantize_q4_0(&ramp(32)),
    );
    let tensors = vec![
        tensor("a", &[3, 2], GgmlType::F32, f32_bytes(&ramp(6))),
        tensor("b.f16", &[4], GgmlType::F16, f16s.concat()),
        tensor("q", &[64, 2], GgmlType::Q8_0, q8),
        tensor("blk.0.ffn_down.weight", &[32, 1, 1, 1], GgmlType::Q4_0, q4),
    ];
    Gguf {
        version: 3,
        align: 64,
        kvs,
        tensors,
    }
}

/// Parses `bytes`, which must fail with [`Error::Format`] at byte `offset`
/// with a message holding every one of `words`.
#[track_caller]
fn expect_format(bytes: &[u8], offset: usize, words: &[&str]) {
    let e = GgufFile::from_bytes(bytes.to_vec(), "bad.gguf").unwrap_err();
    let text = e.to_string();
    let Error::Format {
        offset: at,
        msg,
        path,
    } = e
    else {
        panic!("not a format error: {e:?}")
    };
    assert_eq!(at, offset as u64, "wrong offset for: {msg}");
    assert_eq!(path.to_str(), Some("bad.gguf"));
    assert!(text.contains(&format!("byte {offset}:")), "{text}");
    for w in words {
        assert!(msg.contains(w), "{msg:?} lacks {w:?}");
    }
}

/// A file of one raw metadata pair, and the offset of its value.
fn one_kv(key: &[u8], ty: u32, value: &[u8]) -> (Vec<u8>, usize) {
    (
        gguf(vec![raw_kv(key, ty, value)], vec![]).build().bytes,
        24 + 8 + key.len() + 4,
    )
}

/// Little-endian bytes of `u32`s and `u64`s, concatenated.
fn le(u32s: &[u32], u64s: &[u64]) -> Vec<u8> {
    let a = u32s.iter().flat_map(|v| v.to_le_bytes());
    a.chain(u64s.iter().flat_map(|v| v.to_le_bytes())).collect()
}

/// A header announcing `tensors` tensors and `kvs` pairs, then `rest`.
fn header(version: u32, tensors: u64, kvs: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    put_u32(&mut b, version);
    put_u64(&mut b, tensors);
    put_u64(&mut b, kvs);
    b.extend_from_slice(rest);
    b
}

/// A raw metadata pair: key, type id, value bytes.
fn raw_kv(key: &[u8], ty: u32, value: &[u8]) -> Kv {
    let mut b = vec![];
    put_str(&mut b, key);
    put_u32(&mut b, ty);
    b.extend_from_slice(value);
    Kv::Raw(b)
}

/// A version 3 file with the default alignment.
fn gguf(kvs: Vec<Kv>, tensors: Vec<Tensor>) -> Gguf {
    Gguf {
        version: 3,
        align: 32,
        kvs,
        tensors,
    }
}

/// A version 3 file of tensors only.
fn tensors(tensors: Vec<Tensor>) -> Gguf {
    gguf(vec![], tensors)
}

/// An F32 tensor of `n` bytes of data (`n` need not match `dims`).
fn f32t(name: &str, dims: &[u64], n: usize) -> Tensor {
    tensor(name, dims, GgmlType::F32, vec![0; n])
}

// ---------------------------------------------------------------- valid files

#[test]
fn every_field_round_trips() {
    let g = sample();
    let built = g.build();
    let f = GgufFile::from_bytes(built.bytes.clone(), "mem.gguf").unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.path().to_str(), Some("mem.gguf"));
    assert_eq!(f.data_offset() as usize, built.data_start);
    assert_eq!(built.data_start % 64, 0);

    // Metadata: all of it, in file order, with its values.
    assert_eq!(f.metadata().len(), g.kvs.len());
    for (kv, (key, value)) in g.kvs.iter().zip(f.metadata()) {
        let Kv::Val(k, v) = kv else { unreachable!() };
        assert_eq!((k, v), (&key.as_str(), value));
        assert_eq!(f.get(k), Some(v));
    }
    assert_eq!(f.get("absent"), None);

    // Tensors: infos, absolute offsets, bytes, shapes.
    assert_eq!(f.tensors().len(), 4);
    for (i, (t, info)) in g.tensors.iter().zip(f.tensors()).enumerate() {
        assert_eq!(info.name.as_bytes(), t.name);
        assert_eq!(info.dims, t.dims);
        assert_eq!(info.ggml_type.id(), t.ty);
        assert_eq!(info.offset as usize, built.data_start + built.rel[i]);
        assert_eq!(info.offset % 64, 0);
        assert_eq!(info.size as usize, t.data.len());
        assert_eq!(f.tensor_bytes(info), t.data);
        assert_eq!(f.tensor_info(&info.name), Some(info));
    }
    let a = f.tensor_info("a").unwrap();
    assert_eq!(
        (a.shape(), a.numel(), a.ggml_type.name()),
        (vec![2, 3], 6, "F32".into())
    );
    let q = f.tensor_info("blk.0.ffn_down.weight").unwrap();
    assert_eq!((q.shape(), q.numel(), q.size), (vec![1, 1, 1, 32], 32, 18));
    assert_eq!(f.tensor_info("absent"), None);

    // Dequantized values.
    assert_eq!(f.dequantize("a").unwrap(), (vec![2, 3], ramp(6)));
    assert_eq!(f.dequantize("b.f16").unwrap().1, [1.0, -2.0, 0.5, 65504.0]);
    let (shape, values) = f.dequantize("q").unwrap();
    assert_eq!(shape, vec![2, 64]);
    let expect = quant::dequantize(GgmlType::Q8_0, &quant::quantize_q8_0(&ramp(128)), 128);
    assert_eq!(values, expect.unwrap());
}

#[test]
fn version_2_default_alignment_and_no_tensors() {
    let mut g = gguf(all_kvs(), vec![]);
    g.version = 2;
    let f = GgufFile::from_bytes(g.build().bytes, "v2").unwrap();
    assert_eq!((f.version(), f.alignment(), f.tensors().len()), (2, 32, 0));
    assert_eq!(f.metadata().len(), all_kvs().len());

    let mut g = tensors(vec![
        tensor("x", &[5], GgmlType::F32, f32_bytes(&ramp(5))),
        tensor("y", &[1], GgmlType::F32, f32_bytes(&[7.0])),
    ]);
    g.version = 2;
    let built = g.build();
    let f = GgufFile::from_bytes(built.bytes, "v2").unwrap();
    assert_eq!(f.tensors()[1].offset as usize, built.data_start + 32);
    assert_eq!(f.dequantize("y").unwrap(), (vec![1], vec![7.0]));

    // An empty file of metadata: just a header.
    let f = GgufFile::from_bytes(header(3, 0, 0, &[]), "empty").unwrap();
    assert!(f.metadata().is_empty() && f.tensors().is_empty());
}

#[test]
fn typed_getters() {
    let built = sample().build();
    let f = GgufFile::from_bytes(built.bytes, "mem.gguf").unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u64("t.u8").unwrap(), 200);
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_u64("general.alignment").unwrap(), 64);
    assert_eq!(f.get_f64("t.i16").unwrap(), -30000.0);
    assert_eq!(f.get_f64("t.f32").unwrap(), f64::from(1.5e-3f32));
    assert_eq!(f.get_f64("t.f64").unwrap(), -2.5e300);
    let v = f.get("t.arr.str").and_then(MetaValue::as_array).unwrap();
    let strs: Vec<_> = v.iter().map(|s| s.as_str().unwrap()).collect();
    assert_eq!(strs, ["a", "", "ü"]);
    assert_eq!(f.get("t.true").and_then(MetaValue::as_bool), Some(true));
    assert_eq!(MetaValue::I8(-1).as_u64(), None);
    assert_eq!(MetaValue::I64(5).as_u64(), Some(5));
    assert_eq!(MetaValue::Bool(true).as_u64(), None);
    assert_eq!(MetaValue::String("1".into()).as_f64(), None);

    match f.get_u64("missing.key") {
        Err(e @ Error::Missing { .. }) => assert!(e.to_string().contains("missing.key"), "{e}"),
        other => panic!("{other:?}"),
    }
    // A wrong type names the key, what it is, and the value's offset.
    let i64_at = built.kv_at[13] + 8 + "t.i64".len();
    for (result, want) in [
        (f.get_u64("t.i64").map(|_| ()), "non-negative integer"),
        (f.get_f64("t.str").map(|_| ()), "a number"),
        (f.get_str("t.u32").map(|_| ()), "a string"),
    ] {
        let Err(Error::Format { msg, offset, .. }) = result else {
            panic!("{result:?}")
        };
        assert!(msg.contains(want) && msg.contains("key 't."), "{msg}");
        if want.contains("integer") {
            assert_eq!(offset as usize, i64_at);
        }
    }
}

#[test]
fn dequantize_errors() {
    let g = tensors(vec![tensor("k", &[256], GgmlType::Q2_K, vec![0; 84])]);
    let f = GgufFile::from_bytes(g.build().bytes, "k.gguf").unwrap();
    assert_eq!(f.tensors()[0].size, 84);
    match f.dequantize("k") {
        Err(e @ Error::Unsupported { .. }) => assert!(e.to_string().contains("Q2_K"), "{e}"),
        other => panic!("{other:?}"),
    }
    match f.dequantize("nope") {
        Err(e @ Error::Missing { .. }) => assert!(e.to_string().contains("tensor 'nope'"), "{e}"),
        other => panic!("{other:?}"),
    }
    // Types silica cannot decode still parse when ggml knows their layout.
    let g = tensors(vec![tensor(
        "iq",
        &[512],
        GgmlType::Other(16),
        vec![0; 132],
    )]);
    let f = GgufFile::from_bytes(g.build().bytes, "iq.gguf").unwrap();
    assert_eq!(f.tensors()[0].ggml_type.name(), "IQ2_XXS");
    assert!(matches!(f.dequantize("iq"), Err(Error::Unsupported { .. })));
}

#[test]
fn open_maps_a_file() {
    let bytes = sample().build().bytes;
    let path = std::env::temp_dir().join(format!("silica-gguf-parse-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path);
    let empty = path.with_extension("empty");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty);
    let _ = (std::fs::remove_file(&path), std::fs::remove_file(&empty));
    let f = f.unwrap();
    assert_eq!(f.path(), path);
    let g = GgufFile::from_bytes(bytes, "mem").unwrap();
    assert_eq!(f.metadata(), g.metadata());
    assert_eq!(f.tensors(), g.tensors());
    assert_eq!(f.dequantize("q").unwrap(), g.dequantize("q").unwrap());
    assert!(matches!(e, Err(Error::Format { offset: 0, .. })), "{e:?}");
    assert!(matches!(
        GgufFile::open(path.with_extension("none")),
        Err(Error::Io { .. })
    ));
}

// ---------------------------------------------------------------- rejections

#[test]
fn bad_magic() {
    let mut b = sample().build().bytes;
    b[..4].copy_from_slice(b"GGML");
    expect_format(&b, 0, &["bad magic", "GGML", "not a GGUF file"]);
}

#[test]
fn versions_other_than_2_and_3() {
    for v in [0, 1, 4, u32::MAX] {
        let mut g = sample();
        g.version = v;
        let w = &["unsupported GGUF version", &v.to_string()];
        expect_format(&g.build().bytes, 4, w);
    }
}

#[test]
fn every_truncation_is_an_error() {
    for g in [sample(), gguf(all_kvs(), vec![])] {
        let built = g.build();
        // Without tensors the padding after the infos is optional.
        let end = if g.tensors.is_empty() {
            built.info_end
        } else {
            built.bytes.len()
        };
        let bytes = built.bytes;
        assert!(GgufFile::from_bytes(bytes[..end].to_vec(), "whole").is_ok());
        for n in 0..end {
            match GgufFile::from_bytes(bytes[..n].to_vec(), "cut") {
                Err(Error::Format { offset, msg, .. }) => {
                    assert!(offset as usize <= n, "{n}: {offset} {msg}");
                    let why = [
                        "end of file",
                        "past the end",
                        "bytes left",
                        "needs at least",
                    ];
                    assert!(why.iter().any(|w| msg.contains(w)), "prefix {n}: {msg}");
                }
                other => panic!("prefix of {n} bytes: {other:?}"),
            }
        }
    }
    expect_format(&[], 0, &["unexpected end of file", "magic"]);
    let cut = &header(3, 1, 0, &[])[..20];
    expect_format(cut, 16, &["metadata count", "need 8 bytes, 4 left"]);
}

#[test]
fn huge_string_lengths() {
    // A key of length 2^60 (must not be allocated).
    let b = header(3, 0, 1, &le(&[], &[1 << 60, 0]));
    let w = &["metadata key", "string length 1152921504606846976", "limit"];
    expect_format(&b, 24, w);
    // Under the cap but past the end of the file.
    let b = header(3, 0, 1, &[&le(&[], &[1000])[..], &[b'k'; 20]].concat());
    expect_format(&b, 24, &["string length 1000", "20 bytes left"]);
    // A string value, and a tensor name.
    let (b, at) = one_kv(b"key", 8, &le(&[], &[u64::MAX]));
    expect_format(&b, at, &["string value", "string length"]);
    let b = header(3, 1, 0, &le(&[], &[(64 << 20) + 1, 0, 0]));
    expect_format(&b, 24, &["tensor name", "exceeds the limit"]);
}

#[test]
fn huge_array_counts() {
    for (count, words) in [
        (
            u64::MAX,
            ["array length 18446744073709551615", "exceeds the limit"],
        ),
        (1 << 40, ["array length 1099511627776", "exceeds the limit"]),
        (1000, ["array length 1000", "needs at least 4000 bytes"]),
    ] {
        let (b, at) = one_kv(b"arr", 9, &[&le(&[4], &[count])[..], &[0; 64]].concat());
        expect_format(&b, at + 4, &words);
    }
}

#[test]
fn huge_tensor_and_metadata_counts() {
    let b = header(3, u64::MAX, 0, &[0; 100]);
    expect_format(&b, 8, &["tensor count 18446744073709551615", "impossible"]);
    let w = &["tensor count 5", "100 bytes left"];
    expect_format(&header(3, 5, 0, &[0; 100]), 8, w);
    let b = header(3, 0, 1 << 62, &[0; 100]);
    expect_format(&b, 16, &["metadata key-value count", "impossible"]);
}

#[test]
fn too_many_dims() {
    let b = tensors(vec![f32t("t", &[1, 1, 1, 1, 32], 128)]).build();
    let w = &["tensor 't'", "5 dimensions", "GGML_MAX_DIMS"];
    expect_format(&b.bytes, b.n_dims_at[0], w);
}

#[test]
fn zero_dim() {
    let b = tensors(vec![f32t("z", &[4, 0], 0)]).build();
    let w = &["tensor 'z'", "dimension 1 is zero"];
    expect_format(&b.bytes, b.n_dims_at[0] + 12, w);
}

#[test]
fn overflowing_dims() {
    // Overflowing u64, over 2^48 without overflow, and one huge dim.
    for (dims, dim) in [
        ([1 << 32, 1 << 32], 1),
        ([1 << 40, 1 << 9], 1),
        ([u64::MAX, 2], 0),
    ] {
        let b = tensors(vec![f32t("big", &dims, 4)]).build();
        let at = b.n_dims_at[0] + 4 + 8 * dim;
        expect_format(&b.bytes, at, &["tensor 'big'", "more than 2^48 elements"]);
    }
}

#[test]
fn numel_not_a_multiple_of_the_block_size() {
    // 16 elements of Q4_0 (blocks of 32); and 2 rows of 16 (32 elements,
    // but ggml quantizes rows, so ne[0] must be whole blocks too).
    for dims in [vec![16], vec![16, 2]] {
        let b = tensors(vec![tensor("q", &dims, GgmlType::Q4_0, vec![0; 18])]).build();
        let words = ["tensor 'q'", "not a multiple of the Q4_0 block size 32"];
        expect_format(&b.bytes, b.type_at[0], &words);
    }
}

#[test]
fn unknown_ggml_type() {
    let b = tensors(vec![tensor("u", &[4], GgmlType::Other(4), vec![0; 4])]).build();
    let w = &["tensor 'u'", "unknown ggml type 4"];
    expect_format(&b.bytes, b.type_at[0], w);
}

#[test]
fn data_past_the_end_of_the_file() {
    let mut g = tensors(vec![f32t("a", &[8], 32)]);
    let b = g.build();
    let cut = &b.bytes[..b.bytes.len() - 1];
    let w = &["tensor 'a'", "past the end of the file"];
    expect_format(cut, b.offset_at[0], w);
    g.tensors.push(f32t("far", &[8], 0));
    g.tensors[1].offset = Some(u64::MAX - 31);
    let b = g.build();
    expect_format(&b.bytes, b.offset_at[1], &["tensor 'far'", "past the end"]);
}

#[test]
fn overlapping_tensors() {
    let mut g = tensors(vec![
        f32t("a", &[16], 64),
        f32t("b", &[8], 32),
        f32t("c", &[8], 32),
    ]);
    // c sits inside a; b after both. Sorted by offset: a, c, b.
    for (t, offset) in g.tensors.iter_mut().zip([0, 64, 32]) {
        t.offset = Some(offset);
    }
    let b = g.build();
    let w = &["tensor 'c'", "overlaps tensor 'a'"];
    expect_format(&b.bytes, b.offset_at[2], w);
}

#[test]
fn misaligned_offset() {
    let mut g = tensors(vec![f32t("a", &[1], 4), f32t("b", &[1], 4)]);
    g.tensors[1].offset = Some(4);
    let b = g.build();
    let w = &["tensor 'b'", "data offset 4", "alignment 32"];
    expect_format(&b.bytes, b.offset_at[1], w);
}

#[test]
fn duplicate_tensor_name() {
    let b = tensors(vec![f32t("w", &[1], 4), f32t("w", &[1], 4)]).build();
    expect_format(&b.bytes, b.info_at[1], &["duplicate tensor name 'w'"]);
}

#[test]
fn duplicate_key() {
    let kvs = vec![
        Kv::Val("k", MetaValue::U8(1)),
        Kv::Val("k", MetaValue::U8(2)),
    ];
    let b = gguf(kvs, vec![]).build();
    expect_format(&b.bytes, b.kv_at[1], &["duplicate metadata key 'k'"]);
}

#[test]
fn invalid_utf8() {
    // The offset is that of the first invalid byte.
    let (b, _) = one_kv(b"ok\xff", 0, &[1]);
    expect_format(&b, 24 + 8 + 2, &["metadata key", "invalid UTF-8"]);
    let (b, at) = one_kv(b"s", 8, &[&le(&[], &[2])[..], b"\xc3\x28"].concat());
    expect_format(&b, at + 8, &["string value", "invalid UTF-8"]);
    let mut g = tensors(vec![f32t("x", &[1], 4)]);
    g.tensors[0].name = b"bad\x80name".to_vec();
    let w = &["tensor name", "invalid UTF-8"];
    expect_format(&g.build().bytes, 24 + 8 + 3, w);
}

#[test]
fn unknown_value_types() {
    let b = gguf(
        vec![Kv::Val("a", MetaValue::U8(0)), raw_kv(b"t", 13, &[0; 8])],
        vec![],
    )
    .build();
    let w = &["unknown metadata value type 13"];
    expect_format(&b.bytes, b.kv_at[1] + 8 + 1, w);
    let (b, at) = one_kv(b"t", 9, &le(&[99], &[1]));
    expect_format(&b, at, &["unknown metadata value type 99", "array"]);
}

#[test]
fn invalid_bool() {
    let (b, at) = one_kv(b"b", 7, &[2]);
    expect_format(&b, at, &["invalid bool value 2"]);
}

#[test]
fn arrays_nested_too_deep() {
    let nest = |v: MetaValue| MetaValue::Array(vec![v]);
    let deep = nest(nest(nest(nest(nest(MetaValue::U8(1))))));
    let b = gguf(vec![Kv::Val("deep", deep)], vec![]).build();
    // The fifth array's header follows four (type, count) headers.
    let w = &["nested more than 4 deep"];
    expect_format(&b.bytes, 24 + 8 + 4 + 4 + 4 * 12, w);
}

#[test]
fn bad_alignments() {
    for (value, words) in [
        (
            MetaValue::U32(48),
            &["general.alignment 48", "power of two"][..],
        ),
        (MetaValue::U32(0), &["general.alignment 0", "power of two"]),
        (MetaValue::U64(32), &["general.alignment is u64, not u32"]),
    ] {
        let mut g = sample();
        *g.kvs.last_mut().unwrap() = Kv::Val("general.alignment", value);
        let b = g.build();
        let at = b.kv_at.last().unwrap() + 8 + "general.alignment".len();
        expect_format(&b.bytes, at, words);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random byte edits and cuts of a valid file: any result but a panic;
    /// whatever parses dequantizes without panicking too.
    #[test]
    fn mutated_files_never_panic(
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut bytes = sample().build().bytes;
        let n = bytes.len();
        for (i, v) in edits {
            bytes[i % n] = v;
        }
        bytes.truncate(n - cut % 8);
        if let Ok(f) = GgufFile::from_bytes(bytes, "fuzz") {
            for t in f.tensors() {
                let _ = f.dequantize(&t.name);
            }
        }
    }

    #[test]
    fn random_bytes_after_a_header_never_panic(
        version in 2u32..4,
        counts in (0u64..4, 0u64..4),
        rest in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let _ = GgufFile::from_bytes(header(version, counts.0, counts.1, &rest), "fuzz");
    }
}

// ---------------------------------------------------------------- a real model

/// Reads the model named by `SILICA_TEST_GGUF` (SmolLM2-135M-Instruct
/// Q4_1): structure and metadata. Without the variable, the built-in default decoder.
#[test]
fn real_model_file() {
    let path = match std::env::var("SILICA_TEST_GGUF") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => {
            silica_models::resolve::resolve_decoder(None).expect("the default decoder resolves")
        }
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!((f.version(), f.alignment()), (3, 32));
    assert_eq!((f.tensors().len(), f.metadata().len()), (272, 33));
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u64("llama.embedding_length").unwrap(), 576);
    assert!(f.get_f64("llama.rope.freq_base").unwrap() > 0.0);
    let tokens = f
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert!(tokens.iter().all(|t| t.as_str().is_some()));
    let count = |ty| f.tensors().iter().filter(|t| t.ggml_type == ty).count();
    let counts = [GgmlType::Q4_1, GgmlType::F32, GgmlType::Q8_0].map(count);
    assert_eq!(counts, [210, 61, 1]);
    let emb = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        (emb.ggml_type, &emb.dims[..]),
        (GgmlType::Q8_0, &[576, 49152][..])
    );
    assert_eq!(
        (emb.shape(), emb.size),
        (vec![49152, 576], 49152 * 576 / 32 * 34)
    );
    let norm = f.dequantize("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm.0, vec![576]);
    assert!(norm.1.iter().all(|v| v.is_finite()));
}
