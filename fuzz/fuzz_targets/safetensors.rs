//! Safetensors parsing (header length, JSON header, dtypes, shapes, data
//! offsets), then every tensor read raw and loaded on the CPU in each float
//! dtype, so the shape × dtype × offset checks meet the loader.

#![no_main]

use libfuzzer_sys::fuzz_target;
use silica::{DType, Device};
use silica_models::safetensors::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = SafetensorsFile::from_bytes(data.to_vec(), "fuzz.safetensors") else {
        return;
    };
    let _ = file.user_metadata();
    let device = Device::cpu();
    let names = file.names();
    assert_eq!(names.len(), file.len());
    for name in &names {
        let meta = file.meta(name).expect("a listed tensor has metadata");
        let (raw_meta, bytes) = file.raw(name).expect("a listed tensor has its bytes");
        assert_eq!(meta, raw_meta);
        // the input bounds the data, so loading stays small
        assert!(bytes.len() <= data.len());
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            if let Ok(t) = file.load(name, &device, dtype) {
                assert_eq!(t.shape(), meta.shape.as_slice());
            }
        }
        let _ = file.load(name, &device, DType::U32);
        let _ = file.load_shaped(name, &[1, 2], &device, DType::F32);
    }
    let _ = file.load("no such tensor", &device, DType::F32);
});
