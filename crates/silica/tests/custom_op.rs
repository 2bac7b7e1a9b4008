//! Custom ops (`silica::custom`) on the CPU and on every GPU adapter: the
//! example's LoRA-style kernel against two matmuls, an op updating a tensor
//! in place, the CPU fallback where a kernel's needs are missing (counted,
//! an error in strict mode), check mode, the memory accounting of outputs,
//! and the errors for bad operands and clashing kernel names.
//!
//! Every GPU case opens its own device (`Device::gpu_with_options`), so
//! the strict and check modes set here touch no other test.

mod common;

#[allow(dead_code)]
#[path = "../examples/lora_delta.rs"]
mod lora_delta;

use lora_delta::LoraDelta;
use silica::custom::{self, CustomOp, GpuCall, WgslKernel};
use silica::{DType, Device, Error, GpuOptions, KernelNeeds, Result, Tensor};

/// Every GPU adapter, each opened as a device of its own.
fn own_gpus() -> Vec<Device> {
    let n = common::gpu_devices().len();
    (0..n)
        .map(|i| Device::gpu_with_options(i, &GpuOptions::default()).unwrap())
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec().unwrap()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// x, A, B of a LoRA update on `dev`, from fixed seeds.
fn lora_operands(dev: &Device, m: usize, k: usize, r: usize, n: usize) -> [Tensor; 3] {
    [
        Tensor::randn(&[m, k], DType::F32, 11, dev).unwrap(),
        Tensor::randn(&[k, r], DType::F32, 12, dev).unwrap(),
        Tensor::randn(&[r, n], DType::F32, 13, dev).unwrap(),
    ]
}

/// The example's result on `dev` against two matmuls on the CPU.
fn check_lora(dev: &Device, shape: (usize, usize, usize, usize)) {
    let (m, k, r, n) = shape;
    let [x, a, b] = lora_operands(dev, m, k, r, n);
    let op = LoraDelta { scale: 0.25 };
    let y = custom::apply(&op, &[&x, &a, &b]).unwrap();
    assert_eq!(y.shape(), [m, n]);
    assert!(y.device().same(dev), "the output left {dev}");
    let cpu = Device::Cpu;
    let [xc, ac, bc] = [&x, &a, &b].map(|t| t.to_device(&cpu).unwrap());
    let want = xc.matmul(&ac).unwrap().matmul(&bc).unwrap();
    let want = f32s(&want.mul_scalar(0.25).unwrap());
    assert_close(
        &f32s(&y),
        &want,
        1e-4,
        &format!("lora_delta {shape:?} on {dev}"),
    );
}

#[test]
fn lora_delta_matches_two_matmuls_on_the_cpu() {
    check_lora(&Device::Cpu, (3, 40, 8, 50));
}

#[test]
fn lora_delta_runs_its_kernel_on_every_gpu() {
    for dev in own_gpus() {
        let Device::Gpu(g) = &dev else { unreachable!() };
        g.set_strict(true);
        for shape in [(1, 64, 8, 96), (5, 130, 16, 300), (2, 33, 64, 7)] {
            check_lora(&dev, shape);
        }
        // a rank the kernel does not take: the CPU runs it, counted
        g.set_strict(false);
        check_lora(&dev, (2, 16, 65, 8));
        let report = g.fallback_report();
        assert_eq!(report.len(), 1, "{report:?}");
        assert_eq!(
            (report[0].op.as_str(), report[0].count),
            ("lora_delta/f32", 1)
        );
        // check mode compares the kernel with the CPU reference and keeps
        // the kernel's result
        let [x, a, b] = lora_operands(&dev, 4, 64, 16, 80);
        let op = LoraDelta { scale: 0.5 };
        let plain = f32s(&custom::apply(&op, &[&x, &a, &b]).unwrap());
        g.set_check(true);
        let checked = custom::apply(&op, &[&x, &a, &b]);
        g.set_check(false);
        assert_eq!(
            f32s(&checked.unwrap()),
            plain,
            "check mode changed the result"
        );
        // outputs come from the device's pool
        let before = dev.memory_stats().allocated;
        let y = custom::apply(&op, &[&x, &a, &b]).unwrap();
        assert!(dev.memory_stats().allocated >= before + 4 * 80 * 4);
        drop(y);
    }
}

#[test]
fn bad_operands_are_errors_before_anything_runs() {
    let mut devices = own_gpus();
    devices.push(Device::Cpu);
    for dev in devices {
        let [x, a, b] = lora_operands(&dev, 2, 16, 4, 8);
        let op = LoraDelta { scale: 1.0 };
        let e = custom::apply(&op, &[&x, &b, &a]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::ShapeMismatch {
                    op: "lora_delta",
                    ..
                }
            ),
            "{e}"
        );
        let e = custom::apply(&op, &[&x, &a]).unwrap_err();
        assert!(e.to_string().contains("takes x, A and B"), "{e}");
        let half = x.to_dtype(DType::F16).unwrap();
        let e = custom::apply(&op, &[&half, &a, &b]).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
        if dev.is_gpu() {
            let host = a.to_device(&Device::Cpu).unwrap();
            let e = custom::apply(&op, &[&x, &host, &b]).unwrap_err();
            assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        }
    }
}

/// `acc += x` in place (F32), returning `sum(x)` as a one-element tensor;
/// with `needs` asking for something the device may lack.
struct Accumulate {
    needs: KernelNeeds,
    kernel: &'static WgslKernel,
}

static ACCUMULATE: WgslKernel = WgslKernel {
    name: "accumulate",
    source: ACCUMULATE_WGSL,
    needs: KernelNeeds::NOTHING,
};

static ACCUMULATE_COOP: WgslKernel = WgslKernel {
    name: "accumulate_coop",
    source: ACCUMULATE_WGSL,
    needs: KernelNeeds::COOP16,
};

const ACCUMULATE_WGSL: &str = "
struct Params { n: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> acc: array<f32>;
@group(0) @binding(3) var<storage, read_write> total: array<f32>;
@compute @workgroup_size(1)
fn main() {
    var s = 0.0;
    for (var i = 0u; i < p.n; i++) {
        acc[i] += x[i];
        s += x[i];
    }
    total[0] = s;
}";

impl CustomOp for Accumulate {
    fn name(&self) -> &'static str {
        self.kernel.name
    }

    fn output(&self, inputs: &[&Tensor], in_place: &[&Tensor]) -> Result<(Vec<usize>, DType)> {
        if in_place.len() != 1 || in_place[0].shape() != inputs[0].shape() {
            return Err(Error::InvalidArgument {
                op: self.name(),
                msg: "one accumulator of x's shape".into(),
            });
        }
        Ok((vec![1], DType::F32))
    }

    fn cpu(&self, inputs: &[&Tensor], in_place: &mut [&mut Tensor]) -> Result<Tensor> {
        let x: Vec<f32> = inputs[0].to_vec()?;
        let sum = Tensor::from_vec(vec![x.iter().sum::<f32>()], &[1], &Device::Cpu)?;
        *in_place[0] = in_place[0].add(inputs[0])?;
        Ok(sum)
    }

    fn gpu(&self, call: &mut GpuCall<'_>) -> Result<bool> {
        if !call.features().runs(self.needs) {
            return Ok(false);
        }
        let n = call.inputs()[0].numel() as u32;
        call.dispatch(self.kernel, &custom::params(&[n]), [1, 1, 1])?;
        Ok(true)
    }
}

#[test]
fn in_place_ops_update_the_tensor_on_every_device() {
    let mut devices = own_gpus();
    devices.push(Device::Cpu);
    let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
    let want_sum: f32 = values.iter().sum();
    for dev in devices {
        for (kernel, needs) in [
            (&ACCUMULATE, KernelNeeds::NOTHING),
            (&ACCUMULATE_COOP, KernelNeeds::COOP16),
        ] {
            let op = Accumulate { needs, kernel };
            let x = Tensor::from_slice(&values, &[37], &dev).unwrap();
            let mut acc = Tensor::ones(&[37], DType::F32, &dev).unwrap();
            let shared = acc.clone();
            custom::apply_in_place(&op, &[&x], &mut [&mut acc]).unwrap();
            let total = custom::apply_in_place(&op, &[&x], &mut [&mut acc]).unwrap();
            assert_close(
                &f32s(&total),
                &[want_sum],
                1e-5,
                &format!("{} on {dev}", kernel.name),
            );
            let want: Vec<f32> = values.iter().map(|v| 1.0 + 2.0 * v).collect();
            assert_close(
                &f32s(&acc),
                &want,
                1e-6,
                &format!("{} acc on {dev}", kernel.name),
            );
            assert!(acc.device().same(&dev));
            // a tensor that shared the accumulator's storage keeps its values
            assert_eq!(f32s(&shared), vec![1.0; 37], "{} on {dev}", kernel.name);
            if let Device::Gpu(g) = &dev {
                let fell_back = g
                    .fallback_report()
                    .iter()
                    .any(|f| f.op.starts_with(kernel.name));
                let runs = g.features().runs(needs);
                assert_eq!(
                    fell_back,
                    !runs,
                    "{} on {dev}: {:?}",
                    kernel.name,
                    g.fallback_report()
                );
                if !runs {
                    g.set_strict(true);
                    let e = custom::apply_in_place(&op, &[&x], &mut [&mut acc]).unwrap_err();
                    g.set_strict(false);
                    assert!(matches!(e, Error::FallbackForbidden { .. }), "{e}");
                }
                // check mode compares the output and the updated tensor
                g.set_check(true);
                let checked = custom::apply_in_place(&op, &[&x], &mut [&mut acc]);
                g.set_check(false);
                checked.unwrap();
            }
        }
    }
}

#[test]
fn custom_kernel_names_must_be_unique() {
    static OTHER: WgslKernel = WgslKernel {
        name: "accumulate",
        source: "@compute @workgroup_size(1) fn main() {}",
        needs: KernelNeeds::NOTHING,
    };
    for dev in own_gpus() {
        let x = Tensor::ones(&[4], DType::F32, &dev).unwrap();
        let mut acc = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let good = Accumulate {
            needs: KernelNeeds::NOTHING,
            kernel: &ACCUMULATE,
        };
        custom::apply_in_place(&good, &[&x], &mut [&mut acc]).unwrap();
        let clash = Accumulate {
            needs: KernelNeeds::NOTHING,
            kernel: &OTHER,
        };
        let e = custom::apply_in_place(&clash, &[&x], &mut [&mut acc]).unwrap_err();
        assert!(e.to_string().contains("must be unique"), "{e}");
    }
}

/// The library's own fused ops are custom ops: `head_norm` (Qwen3's head
/// norms) runs as its one kernel on a GPU for f32 and f16, with no
/// fallback, and matches the composed ops.
#[test]
fn head_norm_is_one_kernel_on_every_gpu() {
    for dev in own_gpus() {
        let Device::Gpu(g) = &dev else { unreachable!() };
        g.set_strict(true);
        for dtype in [DType::F32, DType::F16] {
            let x = Tensor::randn(&[3, 8, 64], dtype, 1, &dev).unwrap();
            let qw = Tensor::randn(&[64], dtype, 2, &dev).unwrap();
            let kw = Tensor::randn(&[64], dtype, 3, &dev).unwrap();
            x.head_norm(&qw, &kw, 4, 2, 1e-6).unwrap();
            dev.synchronize().unwrap();
            let profiling = dev.set_profiling(true);
            let y = x.head_norm(&qw, &kw, 4, 2, 1e-6).unwrap();
            dev.synchronize().unwrap();
            dev.set_profiling(false);
            if profiling {
                let report = dev.profile_report();
                let names: Vec<&str> = report.iter().map(|k| k.name.as_str()).collect();
                assert_eq!(names.len(), 1, "{dtype} on {dev}: {names:?}");
                assert!(names[0].starts_with("custom/head_norm"), "{names:?}");
                dev.reset_profile();
            }
            let cpu = Device::Cpu;
            let [xc, qc, kc] = [&x, &qw, &kw].map(|t| t.to_device(&cpu).unwrap());
            let q = xc.narrow(1, 0, 4).unwrap().rms_norm(&qc, 1e-6).unwrap();
            let k = xc.narrow(1, 4, 2).unwrap().rms_norm(&kc, 1e-6).unwrap();
            let v = xc.narrow(1, 6, 2).unwrap();
            let want = Tensor::cat(&[&q, &k, &v], 1).unwrap();
            let tol = if dtype == DType::F32 { 1e-5 } else { 4e-3 };
            assert_close(
                &f32s(&y),
                &f32s(&want),
                tol,
                &format!("head_norm {dtype} on {dev}"),
            );
        }
        assert!(g.fallback_report().is_empty(), "{:?}", g.fallback_report());
    }
}
