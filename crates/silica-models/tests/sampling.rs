//! Sampling on the device (`sampling::draw_rows`): every GPU adapter draws
//! the tokens the CPU draws for the same keys and counters, and greedy rows
//! beside sampled ones keep their argmax.

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use silica::{DType, Tensor};
use silica_models::sampling::{RowDraw, draw_rows};

#[test]
fn every_device_draws_the_cpu_tokens() {
    let (rows, vocab) = (48usize, 3000usize);
    let logits = Tensor::randn(&[rows, vocab], DType::F32, 5, &silica::Device::cpu())
        .unwrap()
        .mul_scalar(3.0)
        .unwrap();
    let draws: Vec<RowDraw> = (0..rows as u64)
        .map(|r| {
            if r % 5 == 0 {
                RowDraw::argmax()
            } else {
                RowDraw {
                    inv_temperature: 1.0 / (0.3 + 0.1 * (r % 9) as f32),
                    key: 1000 + r / 3,
                    counter: r,
                }
            }
        })
        .collect();
    let want: Vec<u32> = draw_rows(&logits, &draws).unwrap().to_vec().unwrap();
    let greedy: Vec<u32> = logits.argmax(-1, false).unwrap().to_vec().unwrap();
    for (r, d) in draws.iter().enumerate() {
        if d.inv_temperature == 0.0 {
            assert_eq!(want[r], greedy[r], "row {r} is greedy");
        }
    }
    // sampled rows do not all take their argmax
    assert!(
        (0..rows).filter(|&r| want[r] != greedy[r]).count() > rows / 4,
        "{want:?} against {greedy:?}"
    );
    for dev in tiny_llama::devices().into_iter().skip(1) {
        let l = logits.to_device(&dev).unwrap();
        let got: Vec<u32> = draw_rows(&l, &draws).unwrap().to_vec().unwrap();
        assert_eq!(got, want, "{dev:?}");
    }
    // bad operands: wrong shape, wrong dtype
    let flat = logits.reshape(&[rows * vocab]).unwrap();
    assert!(draw_rows(&flat, &draws[..1]).is_err());
    assert!(draw_rows(&logits, &draws[..3]).is_err());
    let f16 = logits.to_dtype(DType::F16).unwrap();
    assert!(draw_rows(&f16, &draws).is_err());
}
