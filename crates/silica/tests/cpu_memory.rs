//! The CPU device counts the bytes of its tensors and holds them to a limit,
//! as a GPU's allocator does. (Its own test binary: the CPU's counters and
//! limit are process-wide, so no other test may allocate while it runs.)

use silica::{DType, Device, Error, Tensor};

#[test]
fn cpu_counters_follow_tensors_and_a_limit_gives_out_of_memory() {
    let cpu = Device::cpu();
    let s0 = cpu.memory_stats();
    assert_eq!(s0.allocated, s0.reserved, "nothing is cached on the host");

    // a tensor counts its exact bytes; views count nothing more
    let x = Tensor::zeros(&[1000, 3], DType::F32, &cpu).unwrap();
    let s1 = cpu.memory_stats();
    assert_eq!(s1.allocated - s0.allocated, 12_000);
    assert_eq!(s1.live_buffers - s0.live_buffers, 1);
    let view = x.narrow(0, 10, 100).unwrap().transpose(0, 1).unwrap();
    assert_eq!(cpu.memory_stats().allocated, s1.allocated);

    // op results count; dropping gives everything back; the peak remembers
    let y = x.add(&x).unwrap().to_dtype(DType::F16).unwrap();
    assert_eq!(cpu.memory_stats().allocated - s1.allocated, 6_000);
    drop((x, view, y));
    let s2 = cpu.memory_stats();
    assert_eq!(s2.allocated, s0.allocated);
    assert_eq!(s2.live_buffers, s0.live_buffers);
    assert!(s2.peak_allocated >= s0.allocated + 24_000, "{s2:?}");
    cpu.reset_peak_memory();
    assert_eq!(cpu.memory_stats().peak_allocated, s0.allocated);

    // beyond the limit: an error naming the sizes, from every way of allocating
    let limit = s0.allocated + (1 << 20);
    cpu.set_memory_limit(Some(limit));
    assert_eq!(cpu.memory_stats().limit, Some(limit));
    let small = Tensor::arange(0.0, 1024.0, 1.0, DType::F32, &cpu).unwrap();
    let n = 1usize << 19; // 2 MiB of f32
    let attempts: Vec<(&str, silica::Result<Tensor>)> = vec![
        ("zeros", Tensor::zeros(&[n], DType::F32, &cpu)),
        // refused before the host memory is asked for: 4 TiB would abort
        ("huge zeros", Tensor::zeros(&[1 << 40], DType::F32, &cpu)),
        ("huge ones", Tensor::ones(&[1 << 40], DType::F32, &cpu)),
        ("huge randn", Tensor::randn(&[1 << 40], DType::F32, 1, &cpu)),
        ("from_vec", Tensor::from_vec(vec![1f32; n], &[n], &cpu)),
        (
            "broadcast add",
            small
                .reshape(&[1024, 1])
                .unwrap()
                .add(&small.reshape(&[1, 1024]).unwrap()),
        ),
        (
            "matmul",
            Tensor::ones(&[1024, 1], DType::F32, &cpu)
                .unwrap()
                .matmul(&Tensor::ones(&[1, 1024], DType::F32, &cpu).unwrap()),
        ),
    ];
    for (what, result) in attempts {
        match result {
            Err(e @ Error::OutOfMemory { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("cpu") && msg.contains(&limit.to_string()),
                    "{what}: {msg}"
                );
            }
            other => panic!(
                "{what}: expected OutOfMemory, got {:?}",
                other.map(|t| t.shape().to_vec())
            ),
        }
    }
    // the failures took nothing, and what fits still works
    assert_eq!(cpu.memory_stats().allocated, s0.allocated + 4096);
    let z = small
        .add(&small)
        .unwrap()
        .sum(0, false)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(z[0], 1024.0 * 1023.0); // exact in f32
    cpu.set_memory_limit(None);
    drop(small);
    let big = Tensor::zeros(&[n], DType::F32, &cpu).unwrap();
    assert_eq!(big.shape(), &[n]);
    drop(big);
    assert_eq!(cpu.memory_stats().allocated, s0.allocated);
}
