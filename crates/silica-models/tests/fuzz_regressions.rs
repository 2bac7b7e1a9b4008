//! Inputs the fuzz targets of `fuzz/` (`scripts/fuzz.sh`) found crashing a
//! parser, each kept as a test of the error that replaced the crash.

use silica::{DType, Device};
use silica_models::Error;
use silica_models::safetensors::SafetensorsFile;

/// A safetensors file with one JSON header and the given data.
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn format_error(bytes: Vec<u8>) -> String {
    match SafetensorsFile::from_bytes(bytes, "fuzz.safetensors") {
        Err(e @ Error::Format { .. }) => e.to_string(),
        Err(other) => panic!("expected a format error, got {other:?}"),
        Ok(file) => panic!("expected a format error, got {file:?}"),
    }
}

/// safetensors, found within seconds: a zero-sized tensor passes the
/// `safetensors` crate's checks whatever its other dimensions (their product
/// with the 0 is 0), and loading it multiplied those dimensions into strides
/// and overflowed (a panic with overflow checks on, wrapped strides without).
#[test]
fn zero_sized_tensor_with_overflowing_dimensions() {
    // the fuzzer's input, byte for byte
    let found = safetensors(
        r#"{"a":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}"#,
        b"",
    );
    let msg = format_error(found);
    assert!(msg.contains("tensor `a`"), "{msg}");
    assert!(msg.contains("overflow"), "{msg}");

    // the zero anywhere, other dtypes
    for shape in [
        "[4611686018427387904,4,0]",
        "[65536,0,65536,65536,65536]",
        "[18446744073709551615,2,0]",
    ] {
        let header = format!(r#"{{"b":{{"dtype":"F16","shape":{shape},"data_offsets":[0,0]}}}}"#);
        let msg = format_error(safetensors(&header, b""));
        assert!(msg.contains("overflow"), "{shape}: {msg}");
    }
}

/// Zero-sized tensors whose dimensions multiply without overflow still load.
#[test]
fn zero_sized_tensors_still_load() {
    let header = concat!(
        r#"{"a":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"#,
        r#""b":{"dtype":"BF16","shape":[3,0,1048576],"data_offsets":[0,0]}}"#
    );
    let file = SafetensorsFile::from_bytes(safetensors(header, b""), "zero.safetensors").unwrap();
    let cpu = Device::cpu();
    let a = file.load("a", &cpu, DType::F32).unwrap();
    assert_eq!(a.shape(), &[0, 4]);
    assert_eq!(a.numel(), 0);
    let b = file.load("b", &cpu, DType::F16).unwrap();
    assert_eq!(b.shape(), &[3, 0, 1_048_576]);
    assert_eq!(b.numel(), 0);
}
