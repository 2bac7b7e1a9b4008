//! Reading safetensors files: round trips through the `safetensors` crate's
//! own writer, dtype conversions, prefixed names, and malformed files, which
//! must give `Error::Format` (never a panic).

use std::path::PathBuf;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};
use silica::{DType, Device, Tensor};
use silica_models::Error;
use silica_models::safetensors::SafetensorsFile;

/// A file in a fresh temporary folder, removed at the end of the test.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> TempFile {
        let dir = std::env::temp_dir().join(format!(
            "silica-safetensors-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn le_bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le_bytes_u16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small file with one tensor of each float dtype, one prefixed name and
/// an integer tensor.
fn sample_file() -> Vec<u8> {
    let a: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let h: Vec<u16> = [1.0f32, -2.5, 3.25, 65504.0]
        .iter()
        .map(|&x| f16::from_f32(x).to_bits())
        .collect();
    let bf: Vec<u16> = [0.5f32, -1.0, 1.0e30]
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect();
    let ints: Vec<u8> = [7i64, -3].iter().flat_map(|x| x.to_le_bytes()).collect();
    let (a, h, bf, p) = (
        le_bytes_f32(&a),
        le_bytes_u16(&h),
        le_bytes_u16(&bf),
        le_bytes_f32(&[42.0]),
    );
    let tensors = vec![
        (
            "a.weight",
            TensorView::new(Dtype::F32, vec![2, 3], &a).unwrap(),
        ),
        ("h", TensorView::new(Dtype::F16, vec![4], &h).unwrap()),
        ("bf", TensorView::new(Dtype::BF16, vec![3], &bf).unwrap()),
        (
            "bert.pooler.bias",
            TensorView::new(Dtype::F32, vec![1], &p).unwrap(),
        ),
        (
            "model.norm.weight",
            TensorView::new(Dtype::F32, vec![1], &p).unwrap(),
        ),
        ("ids", TensorView::new(Dtype::I64, vec![2], &ints).unwrap()),
    ];
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize(tensors, Some(meta)).unwrap()
}

fn devices() -> Vec<Device> {
    let mut devs = vec![Device::cpu()];
    if !silica::adapters().is_empty() {
        devs.push(Device::gpu(0).unwrap());
    }
    devs
}

#[test]
fn round_trip_all_float_dtypes() {
    let file = TempFile::new("roundtrip", &sample_file());
    let st = SafetensorsFile::open(&file.0).unwrap();
    assert_eq!(st.len(), 6);
    assert_eq!(
        st.names(),
        vec![
            "a.weight",
            "bert.pooler.bias",
            "bf",
            "h",
            "ids",
            "model.norm.weight"
        ]
    );
    assert_eq!(
        st.user_metadata()
            .and_then(|m| m.get("format"))
            .map(String::as_str),
        Some("pt")
    );
    for dev in devices() {
        let a = st.load("a.weight", &dev, DType::F32).unwrap();
        assert_eq!(a.shape(), &[2, 3]);
        assert_eq!(a.dtype(), DType::F32);
        assert_eq!(
            a.to_vec::<f32>().unwrap(),
            vec![-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]
        );
        for dtype in [DType::F16, DType::BF16] {
            let a = st.load("a.weight", &dev, dtype).unwrap();
            assert_eq!(a.dtype(), dtype);
            let back = a.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(back, vec![-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
        }

        let h = st.load("h", &dev, DType::F32).unwrap();
        assert_eq!(h.to_vec::<f32>().unwrap(), vec![1.0, -2.5, 3.25, 65504.0]);
        let h16 = st.load("h", &dev, DType::F16).unwrap();
        assert_eq!(h16.dtype(), DType::F16);
        assert_eq!(
            h16.to_vec::<f16>().unwrap(),
            [1.0f32, -2.5, 3.25, 65504.0].map(f16::from_f32).to_vec()
        );

        let bf = st.load("bf", &dev, DType::F32).unwrap();
        assert_eq!(
            bf.to_vec::<f32>().unwrap(),
            [0.5f32, -1.0, 1.0e30]
                .map(|x| bf16::from_f32(x).to_f32())
                .to_vec()
        );
        let bf_native = st.load("bf", &dev, DType::BF16).unwrap();
        assert_eq!(bf_native.dtype(), DType::BF16);
        // bf16 -> f16: 1e30 is past f16's range
        let bf_as_f16 = st
            .load("bf", &dev, DType::F16)
            .unwrap()
            .to_vec::<f16>()
            .unwrap();
        assert_eq!(bf_as_f16[0], f16::from_f32(0.5));
        assert!(bf_as_f16[2].is_infinite());
    }
}

#[test]
fn names_with_and_without_prefixes() {
    let st = SafetensorsFile::from_bytes(sample_file(), "mem.safetensors").unwrap();
    let dev = Device::cpu();
    // exact names win; then bert., model.
    assert_eq!(st.find("a.weight").as_deref(), Some("a.weight"));
    assert_eq!(st.find("pooler.bias").as_deref(), Some("bert.pooler.bias"));
    assert_eq!(st.find("norm.weight").as_deref(), Some("model.norm.weight"));
    assert_eq!(
        st.find("bert.pooler.bias").as_deref(),
        Some("bert.pooler.bias")
    );
    assert!(st.find("nothing").is_none());
    let t = st.load("pooler.bias", &dev, DType::F32).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![42.0]);
    let t = st.load("norm.weight", &dev, DType::F32).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![42.0]);
    let meta = st.meta("pooler.bias").unwrap();
    assert_eq!((meta.dtype, meta.shape), (Dtype::F32, vec![1]));

    match st.load("missing.weight", &dev, DType::F32) {
        Err(Error::Missing { what, .. }) => assert!(what.contains("missing.weight"), "{what}"),
        other => panic!("expected Error::Missing, got {other:?}"),
    }
    // integers are not loaded as floats
    assert!(matches!(
        st.load("ids", &dev, DType::F32),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        st.load("a.weight", &dev, DType::U32),
        Err(Error::Unsupported { .. })
    ));
    // shape check
    assert!(matches!(
        st.load_shaped("a.weight", &[3, 2], &dev, DType::F32),
        Err(Error::Format { .. })
    ));
    assert!(
        st.load_shaped("a.weight", &[2, 3], &dev, DType::F32)
            .is_ok()
    );
}

#[test]
fn loaded_tensors_compute() {
    // A loaded weight behaves like any tensor: x @ w.T on the CPU.
    let st = SafetensorsFile::from_bytes(sample_file(), "mem.safetensors").unwrap();
    let dev = Device::cpu();
    let w = st.load("a.weight", &dev, DType::F32).unwrap();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3], &dev).unwrap();
    let y = x.matmul(&w.t().unwrap()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-2.0, 7.0]);
}

/// Asserts `bytes` is rejected with `Error::Format` mentioning `needle`.
fn assert_format_error(bytes: Vec<u8>, needle: &str) -> u64 {
    let result = std::panic::catch_unwind(|| SafetensorsFile::from_bytes(bytes, "bad.safetensors"));
    match result {
        Ok(Err(Error::Format { path, offset, msg })) => {
            assert_eq!(path, PathBuf::from("bad.safetensors"));
            assert!(
                msg.to_lowercase().contains(needle),
                "message {msg:?} lacks {needle:?}"
            );
            offset
        }
        Ok(Err(e)) => panic!("expected Error::Format, got {e:?}"),
        Ok(Ok(_)) => panic!("a malformed file was accepted"),
        Err(_) => panic!("reading a malformed file panicked"),
    }
}

/// A file from a header text and data bytes.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn malformed_files_are_format_errors() {
    let good = sample_file();
    // sanity: the raw writer below makes valid files
    let ok = raw_file(
        r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    assert!(SafetensorsFile::from_bytes(ok, "ok").is_ok());

    // empty and truncated length fields
    assert_eq!(assert_format_error(Vec::new(), "too short"), 0);
    assert_eq!(assert_format_error(vec![1, 0, 0], "too short"), 0);
    // truncated header: the length says more than the file has
    assert_eq!(assert_format_error(good[..20].to_vec(), "header"), 0);
    // header length past the end of the file (and absurdly large)
    let mut past = good.clone();
    past[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    assert_eq!(assert_format_error(past, "header"), 0);
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(assert_format_error(huge, "header"), 0);
    // bad JSON, with the offset of the problem
    let offset = assert_format_error(raw_file(r#"{"x": nope}"#, &[]), "json");
    assert!((8 + 6..=8 + 7).contains(&offset), "offset {offset}"); // at `nope`
    assert_format_error(raw_file("not json at all", &[]), "json");
    // invalid UTF-8 in the header
    let mut utf = raw_file(r#"{"x":1}"#, &[]);
    utf[10] = 0xff;
    assert_format_error(utf, "utf-8");
    // unknown dtype, or a header that is not a map of tensors
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}"#,
            &[0; 4],
        ),
        "json",
    );
    assert_format_error(raw_file("[1, 2, 3]", &[]), "json");
    // data offsets past the end of the data
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &[0; 4],
        ),
        "",
    );
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            &[0; 8],
        ),
        "offset",
    );
    // offsets that disagree with dtype x shape
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        ),
        "",
    );
    // reversed offsets, and a shape whose size overflows
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
            &[0; 8],
        ),
        "",
    );
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F32","shape":[18446744073709551615,4],"data_offsets":[0,8]}}"#,
            &[0; 8],
        ),
        "",
    );
    // trailing bytes not covered by any tensor
    assert_format_error(
        raw_file(
            r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            &[0; 8],
        ),
        "",
    );
    // every truncation of a valid file is an error, never a panic
    for len in 0..good.len() {
        assert_format_error(good[..len].to_vec(), "");
    }
}

#[test]
fn files_on_disk_errors() {
    let file = TempFile::new("truncated", &sample_file()[..30]);
    match SafetensorsFile::open(&file.0) {
        Err(Error::Format { path, .. }) => assert_eq!(path, file.0),
        other => panic!("expected Error::Format, got {other:?}"),
    }
    let empty = TempFile::new("empty", &[]);
    assert!(matches!(
        SafetensorsFile::open(&empty.0),
        Err(Error::Format { offset: 0, .. })
    ));
    let missing = std::env::temp_dir().join("silica-no-such-file.safetensors");
    assert!(matches!(
        SafetensorsFile::open(&missing),
        Err(Error::Io { .. })
    ));
}
