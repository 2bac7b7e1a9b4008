//! The GGUF writer: files it writes are read back by `GgufFile` with the
//! same metadata (every value type), shapes, types and tensor bytes, at the
//! alignment asked for; streamed data equals data given in memory; and each
//! thing the reader would reject is an error of the writer, not a panic.

use silica_models::Error;
use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use silica_models::quant;

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `n` values of a fixed pseudo-random pattern in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as f32 / u32::MAX as f32 * 2.0 - 1.0
        })
        .collect()
}

/// One value of every type, arrays of each, nested arrays and an empty one.
fn all_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let scalars = vec![
        U8(255),
        I8(-128),
        U16(65535),
        I16(-32768),
        U32(u32::MAX),
        I32(i32::MIN),
        F32(-1.5e-7),
        Bool(true),
        String("héllo ▁ wörld".into()),
        U64(u64::MAX),
        I64(i64::MIN),
        F64(std::f64::consts::PI),
    ];
    let mut meta: Vec<(std::string::String, MetaValue)> = scalars
        .iter()
        .map(|v| (format!("test.scalar.{}", v.type_name()), v.clone()))
        .collect();
    for v in &scalars {
        let array = Array(vec![v.clone(), v.clone(), v.clone()]);
        meta.push((format!("test.array.{}", v.type_name()), array));
    }
    meta.push((
        "test.empty_string".into(),
        String(std::string::String::new()),
    ));
    meta.push(("test.empty_array".into(), Array(vec![])));
    meta.push((
        "test.nested".into(),
        Array(vec![
            Array(vec![I32(1), I32(2)]),
            Array(vec![]),
            Array(vec![I32(3)]),
        ]),
    ));
    meta.push((
        "test.strings".into(),
        Array(vec![
            String("a".into()),
            String("".into()),
            String("<0x0A>".into()),
        ]),
    ));
    meta
}

/// Tensors of several types and shapes, with their bytes.
fn all_tensors() -> Vec<(&'static str, Vec<usize>, GgmlType, Vec<u8>)> {
    let v = values(64 * 3, 1);
    let f16: Vec<u8> = values(7, 2)
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    vec![
        ("scalar_row", vec![1], GgmlType::F32, f32_bytes(&[4.0])),
        ("odd", vec![7], GgmlType::F16, f16),
        ("q8", vec![3, 64], GgmlType::Q8_0, quant::quantize_q8_0(&v)),
        (
            "q4_0",
            vec![6, 32],
            GgmlType::Q4_0,
            quant::quantize_q4_0(&v),
        ),
        (
            "q4_1",
            vec![2, 1, 3, 32],
            GgmlType::Q4_1,
            quant::quantize_q4_1(&v),
        ),
        ("q4_k", vec![2, 256], GgmlType::Q4_K, vec![7; 2 * 144]),
        ("ints", vec![5], GgmlType::Other(26), vec![1; 20]), // I32
        (
            "f32_2d",
            vec![3, 5],
            GgmlType::F32,
            f32_bytes(&values(15, 3)),
        ),
    ]
}

fn check_round_trip(f: &GgufFile, meta: &[(String, MetaValue)], alignment: u64) {
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), alignment);
    assert_eq!(f.data_offset() % alignment, 0);
    assert_eq!(f.metadata(), meta);
    let tensors = all_tensors();
    assert_eq!(f.tensors().len(), tensors.len());
    for ((name, shape, ty, bytes), info) in tensors.iter().zip(f.tensors()) {
        assert_eq!(info.name, *name);
        assert_eq!(info.shape(), *shape, "{name}");
        assert_eq!(info.ggml_type, *ty, "{name}");
        assert_eq!(info.offset % alignment, 0, "{name} at {}", info.offset);
        assert_eq!(f.tensor_bytes(info), bytes.as_slice(), "{name}");
    }
}

fn writer_with_all(meta: &[(String, MetaValue)]) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.metadata(k.as_str(), v.clone()).unwrap();
    }
    for (name, shape, ty, bytes) in all_tensors() {
        w.add_tensor(name, &shape, ty, bytes).unwrap();
    }
    w
}

#[test]
fn every_metadata_type_and_tensor_reads_back_identically() {
    let meta = all_metadata();
    let bytes = writer_with_all(&meta).write(Vec::new()).unwrap();
    let f = GgufFile::from_bytes(bytes.clone(), "mem.gguf").unwrap();
    check_round_trip(&f, &meta, 32);
    assert_eq!(bytes.len() % 32, 0, "the data is padded to the alignment");
    // dequantized values come back too
    let (shape, x) = f.dequantize("f32_2d").unwrap();
    assert_eq!(shape, [3, 5]);
    assert_eq!(x, values(15, 3));
}

#[test]
fn general_alignment_is_honoured() {
    for alignment in [1u32, 8, 64, 4096] {
        let mut meta = all_metadata();
        meta.insert(3, ("general.alignment".into(), MetaValue::U32(alignment)));
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(format!("gguf_write_align_{alignment}.gguf"));
        writer_with_all(&meta).write_to_path(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        check_round_trip(&f, &meta, u64::from(alignment));
    }
}

#[test]
fn setting_a_key_again_replaces_it_in_place() {
    let mut w = GgufWriter::new();
    w.metadata("a", MetaValue::U32(1))
        .unwrap()
        .metadata("b", MetaValue::Bool(false))
        .unwrap()
        .metadata("a", MetaValue::String("x".into()))
        .unwrap();
    let f = GgufFile::from_bytes(w.write(Vec::new()).unwrap(), "mem").unwrap();
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(f.get_str("a").unwrap(), "x");
}

#[test]
fn streamed_data_equals_data_in_memory() {
    let meta = all_metadata();
    let in_memory = writer_with_all(&meta).write(Vec::new()).unwrap();

    // Declare every other tensor and stream it in pieces of 5 bytes.
    let mut w = GgufWriter::new();
    for (k, v) in &meta {
        w.metadata(k.as_str(), v.clone()).unwrap();
    }
    let tensors = all_tensors();
    for (i, (name, shape, ty, bytes)) in tensors.iter().enumerate() {
        if i % 2 == 0 {
            w.declare_tensor(*name, shape, *ty).unwrap();
        } else {
            w.add_tensor(*name, shape, *ty, bytes.clone()).unwrap();
        }
    }
    let mut s = w.begin(Vec::new()).unwrap();
    for (name, _, _, bytes) in tensors.iter().step_by(2) {
        assert_eq!(s.next_tensor(), Some(*name));
        s.write_tensor_with(name, |sink| bytes.chunks(5).try_for_each(|c| sink.write(c)))
            .unwrap();
    }
    assert_eq!(s.next_tensor(), None);
    let streamed = s.finish().unwrap();
    assert_eq!(streamed, in_memory);
}

fn invalid_input(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::InvalidInput(msg)) => msg,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn bad_tensors_are_errors() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[2, 32], GgmlType::Q8_0, vec![0; 68])
        .unwrap();

    let msg = invalid_input(
        w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16])
            .map(drop),
    );
    assert!(msg.contains("duplicate tensor name 'a'"), "{msg}");
    let msg = invalid_input(w.declare_tensor("a", &[4], GgmlType::F32).map(drop));
    assert!(msg.contains("duplicate"), "{msg}");

    let msg = invalid_input(
        w.add_tensor("b", &[2, 32], GgmlType::Q8_0, vec![0; 67])
            .map(drop),
    );
    assert!(
        msg.contains("'b'") && msg.contains("68") && msg.contains("67"),
        "{msg}"
    );

    let msg = invalid_input(
        w.add_tensor("c", &[32, 2], GgmlType::Q4_0, vec![0; 36])
            .map(drop),
    );
    assert!(msg.contains("rows of 2") && msg.contains("Q4_0"), "{msg}");

    let msg = invalid_input(w.add_tensor("d", &[2, 0], GgmlType::F32, vec![]).map(drop));
    assert!(msg.contains("zero"), "{msg}");
    let msg = invalid_input(w.add_tensor("e", &[], GgmlType::F32, vec![0; 4]).map(drop));
    assert!(msg.contains("dimensions"), "{msg}");
    let msg = invalid_input(
        w.declare_tensor("f", &[1, 1, 1, 1, 1], GgmlType::F32)
            .map(drop),
    );
    assert!(msg.contains("dimensions"), "{msg}");
    let msg = invalid_input(
        w.declare_tensor("g", &[1 << 30, 1 << 30], GgmlType::F32)
            .map(drop),
    );
    assert!(msg.contains("2^48"), "{msg}");
    let msg = invalid_input(w.declare_tensor("h", &[4], GgmlType::Other(999)).map(drop));
    assert!(msg.contains("unknown ggml type"), "{msg}");
    let long = "x".repeat(64);
    let msg = invalid_input(w.declare_tensor(long, &[4], GgmlType::F32).map(drop));
    assert!(msg.contains("64 bytes"), "{msg}");

    // The failed calls left the writer as it was: one tensor.
    assert_eq!(w.tensor_count(), 1);
    let f = GgufFile::from_bytes(w.write(Vec::new()).unwrap(), "mem").unwrap();
    assert_eq!(f.tensors().len(), 1);
}

#[test]
fn bad_metadata_is_an_error() {
    use MetaValue::*;
    let mut w = GgufWriter::new();
    let msg = invalid_input(w.metadata("m", Array(vec![U32(1), I32(2)])).map(drop));
    assert!(
        msg.contains("'m'") && msg.contains("element 1 is i32"),
        "{msg}"
    );
    let deep = Array(vec![Array(vec![Array(vec![Array(vec![Array(vec![])])])])]);
    let msg = invalid_input(w.metadata("deep", deep).map(drop));
    assert!(msg.contains("nested"), "{msg}");
    for bad in [U32(48), U32(0), U64(32), String("32".into())] {
        let msg = invalid_input(w.metadata("general.alignment", bad).map(drop));
        assert!(msg.contains("general.alignment"), "{msg}");
    }
    assert!(w.metadata_entries().is_empty());

    // Arrays of arrays are fine with inner arrays of different types: each
    // inner array carries its own element type.
    let mixed = Array(vec![Array(vec![U8(1)]), Array(vec![String("s".into())])]);
    w.metadata("n", mixed.clone()).unwrap();
    let f = GgufFile::from_bytes(w.write(Vec::new()).unwrap(), "mem").unwrap();
    assert_eq!(f.get("n"), Some(&mixed));
}

#[test]
fn streams_check_order_and_length() {
    let declared = || {
        let mut w = GgufWriter::new();
        w.declare_tensor("a", &[8], GgmlType::F32).unwrap();
        w.declare_tensor("b", &[4], GgmlType::F32).unwrap();
        w
    };
    let msg = invalid_input(declared().write(Vec::new()));
    assert!(msg.contains("'a'") && msg.contains("no data"), "{msg}");

    let mut s = declared().begin(Vec::new()).unwrap();
    let msg = invalid_input(s.write_tensor("b", &[0; 16]));
    assert!(msg.contains("out of order") && msg.contains("'a'"), "{msg}");
    let msg = invalid_input(s.write_tensor("a", &[0; 33]));
    assert!(msg.contains("33") && msg.contains("32"), "{msg}");

    let mut s = declared().begin(Vec::new()).unwrap();
    let msg = invalid_input(s.write_tensor("a", &[0; 31]));
    assert!(msg.contains("needs 32 bytes, got 31"), "{msg}");

    let mut s = declared().begin(Vec::new()).unwrap();
    s.write_tensor("a", &[0; 32]).unwrap();
    let msg = invalid_input(s.finish());
    assert!(msg.contains("'b'"), "{msg}");

    let mut s = declared().begin(Vec::new()).unwrap();
    s.write_tensor("a", &[0; 32]).unwrap();
    s.write_tensor("b", &[0; 16]).unwrap();
    let msg = invalid_input(s.write_tensor("c", &[]));
    assert!(msg.contains("no declared tensor"), "{msg}");
    let f = GgufFile::from_bytes(s.finish().unwrap(), "mem").unwrap();
    assert_eq!(f.tensors().len(), 2);
}

#[test]
fn output_errors_name_the_path() {
    let w = GgufWriter::new();
    let path = std::path::Path::new("/nonexistent-dir/x.gguf");
    match w.write_to_path(path) {
        Err(Error::Io { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected an Io error, got {other:?}"),
    }
}
