//! How a GPU's speed follows its load: one f16 product (`[16, 2048]` by
//! a `[16384, 2048]` weight, transposed) run back to back for six
//! seconds, then with a 20 ms pause after every 50 products, then back to
//! back again, each second's mean wall time per product printed. On an
//! NVIDIA H200 through Vulkan the first phase settles at about 60 µs, the
//! paused phase slows to about 200 µs within six seconds as the SM clock
//! falls from 1,980 MHz to 480 (260 µs at its idle 345 MHz; watch `nvidia-smi --query-gpu=clocks.sm --format=csv -lms 250` beside
//! it), and the last phase recovers within a second (docs/tuning.md, "GPU
//! clocks follow the load").
//!
//! ```sh
//! cargo run --release -p silica-cli --example gpu_clock
//! ```

use std::time::{Duration, Instant};

use silica::{DType, Device, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::best()?;
    println!("{}", device.name());
    let x = Tensor::randn(&[16, 2048], DType::F16, 3, &device)?;
    let w = Tensor::randn(&[16384, 2048], DType::F16, 1, &device)?;
    let wt = w.t()?;
    let start = Instant::now();
    for (phase, pause) in [
        ("back to back", None),
        ("paused", Some(20)),
        ("back to back", None),
    ] {
        for _ in 0..6 {
            let second = Instant::now();
            let mut count = 0;
            while second.elapsed() < Duration::from_secs(1) {
                for _ in 0..50 {
                    drop(x.matmul(&wt)?);
                }
                device.synchronize()?;
                count += 50;
                if let Some(ms) = pause {
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
            // the pauses left out
            let paused_us = (count / 50 * pause.unwrap_or(0)) as f64 * 1e3;
            let busy_us = (second.elapsed().as_secs_f64() * 1e6 - paused_us) / count as f64;
            println!(
                "t = {:5.2} s, {phase}: {count} products, {busy_us:.1} µs each",
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
