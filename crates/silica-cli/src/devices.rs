//! `silica devices [--ops] [--device SEL]`: what this machine can run on.

use std::fmt::Write;

use silica::{DType, Device, DeviceInfo, Op, Selector};

use crate::{CliError, emit};

#[derive(clap::Args)]
pub struct DevicesArgs {
    /// Also print, for one device, which ops run natively for each dtype and
    /// which fall back to the CPU.
    #[arg(long)]
    ops: bool,
    /// The device for --ops: cpu, gpu, gpu:N, metal, vulkan, dx12, gl or part
    /// of an adapter's name [default: as SILICA_DEVICE, else the best GPU]
    #[arg(long, value_name = "SEL", requires = "ops")]
    device: Option<String>,
}

pub fn run(args: &DevicesArgs) -> Result<(), CliError> {
    // Open the device first, so that a bad selector prints nothing but the error.
    let ops_device = match (args.ops, &args.device) {
        (false, _) => None,
        (true, sel) => Some(crate::open_device(sel.as_deref())?),
    };
    emit(&device_list()?)?;
    if let Some(dev) = ops_device {
        emit(&ops_table(&dev)?)?;
    }
    Ok(())
}

/// The device `Device::best()` picks, found without opening it: `Ok(None)`
/// is the CPU, `Ok(Some(i))` is `gpu:i`. Also says why it is the default.
fn default_device(adapters: &[DeviceInfo]) -> (Result<Option<usize>, silica::Error>, String) {
    match silica::config::device_selector() {
        Some(s) => {
            let pick = Selector::parse(&s).and_then(|sel| sel.resolve(adapters, &s));
            (pick, format!("chosen by SILICA_DEVICE={s}"))
        }
        None => match silica::default_gpu_index() {
            Some(i) => (Ok(Some(i)), "the best hardware GPU".to_string()),
            None => (
                Ok(None),
                "no hardware GPU adapter was found; set SILICA_DEVICE to choose another"
                    .to_string(),
            ),
        },
    }
}

fn device_list() -> Result<String, CliError> {
    let adapters = silica::adapters();
    let (pick, why) = default_device(&adapters);
    let default = pick.as_ref().ok().copied();
    let mut out = String::new();

    writeln!(out, "Devices (select one with SILICA_DEVICE=<selector>):")?;
    writeln!(out)?;
    let cpu = Device::cpu().info();
    let mark = if default == Some(None) { "*" } else { " " };
    writeln!(out, "{mark} {:<8}{}", "cpu", cpu.name)?;
    writeln!(
        out,
        "{:10}native CPU backend, memory {}, f16 yes",
        "",
        cpu.memory_bytes.map_or("unknown".to_string(), size)
    )?;

    let mut software = false;
    for (pos, a) in adapters.iter().enumerate() {
        let index = a.index.unwrap_or(pos);
        let is_software = a.device_type == "Cpu";
        software |= is_software;
        let mark = if default == Some(Some(index)) {
            "*"
        } else {
            " "
        };
        let selector = format!("gpu:{index}");
        let note = if is_software {
            "  [software adapter, for testing]"
        } else {
            ""
        };
        writeln!(out, "{mark} {selector:<8}{}{note}", a.name)?;
        gpu_details(&mut out, a)?;
    }
    if adapters.is_empty() {
        writeln!(
            out,
            "  (no GPU adapter found{})",
            std::env::var("WGPU_BACKEND")
                .map_or(String::new(), |b| format!(" with WGPU_BACKEND={b}"))
        )?;
    }

    writeln!(out)?;
    match &pick {
        Ok(Some(i)) => writeln!(out, "* default device: gpu:{i} ({why})")?,
        Ok(None) => writeln!(out, "* default device: cpu ({why})")?,
        Err(e) => writeln!(out, "No default device: {e}")?,
    }
    if software {
        writeln!(
            out,
            "Software adapters (device type Cpu, such as Mesa's lavapipe) are for testing: \
             they are never the default and are slower than the native CPU backend."
        )?;
    }
    Ok(out)
}

fn gpu_details(out: &mut String, a: &DeviceInfo) -> Result<(), CliError> {
    let pad = "";
    writeln!(
        out,
        "{pad:10}backend {}, type {}, driver {}",
        a.backend.as_str(),
        a.device_type,
        if a.driver.is_empty() {
            "unknown"
        } else {
            &a.driver
        }
    )?;
    writeln!(
        out,
        "{pad:10}memory {}, max buffer {}, max storage binding {}",
        a.memory_bytes.map_or("unknown".to_string(), size),
        size(a.max_buffer),
        size(a.max_storage_binding)
    )?;
    writeln!(
        out,
        "{pad:10}workgroup storage {}, {} invocations per workgroup",
        size(u64::from(a.workgroup_storage)),
        a.max_invocations
    )?;
    let subgroups = if a.subgroups {
        format!("yes ({}..{})", a.subgroup_size.0, a.subgroup_size.1)
    } else {
        "no".to_string()
    };
    let coop = if a.cooperative_matrix.is_empty() {
        "none".to_string()
    } else {
        a.cooperative_matrix.join(", ")
    };
    writeln!(
        out,
        "{pad:10}f16 {}, subgroups {subgroups}, timestamps {}, cooperative matrix {coop}",
        yes_no(a.f16),
        yes_no(a.timestamps)
    )?;
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// `512 B`, `32 KiB`, `128 MiB`, `7.6 GiB`; `u64::MAX` is "unlimited".
fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    if bytes == u64::MAX {
        return "unlimited".to_string();
    }
    for (unit, scale) in UNITS {
        if bytes >= scale {
            let v = bytes as f64 / scale as f64;
            return if bytes.is_multiple_of(scale) {
                format!("{} {unit}", bytes / scale)
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

/// How `op` with inputs of `dtype` runs on `dev`.
#[derive(Clone, Copy, PartialEq)]
enum Support {
    Native,
    Fallback,
    Undefined,
}

fn support(dev: &Device, op: &Op, dtype: DType) -> Support {
    if !op.accepts(dtype) {
        return Support::Undefined;
    }
    match dev {
        Device::Cpu => Support::Native,
        Device::Gpu(g) => {
            let inputs: Vec<DType> = match op {
                Op::Where => vec![DType::U32, dtype, dtype],
                Op::IndexSelect { .. } => vec![dtype, DType::U32],
                Op::Binary(_) | Op::Compare(_) | Op::Matmul => vec![dtype, dtype],
                _ => vec![dtype],
            };
            if g.supports(op, &inputs) {
                Support::Native
            } else {
                Support::Fallback
            }
        }
    }
}

fn ops_table(dev: &Device) -> Result<String, CliError> {
    let ops = Op::catalogue();
    let width = ops.iter().map(|o| o.name().len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    writeln!(out)?;
    writeln!(out, "Ops on {dev}:")?;
    writeln!(
        out,
        "  native = a kernel of this device, cpu = runs on the CPU instead, \
         - = not defined for the dtype"
    )?;
    writeln!(out)?;
    let mut header = format!("{:width$}", "op");
    for d in DType::ALL {
        write!(header, "{:<8}", d.as_str())?;
    }
    writeln!(out, "{}", header.trim_end())?;
    let (mut native, mut fallback) = (0, 0);
    for op in &ops {
        let mut row = format!("{:width$}", op.name());
        for d in DType::ALL {
            let cell = match support(dev, op, d) {
                Support::Native => {
                    native += 1;
                    "native"
                }
                Support::Fallback => {
                    fallback += 1;
                    "cpu"
                }
                Support::Undefined => "-",
            };
            write!(row, "{cell:<8}")?;
        }
        writeln!(out, "{}", row.trim_end())?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{native} native, {fallback} CPU fallback ({} ops x {} dtypes; SILICA_STRICT=1 turns fallbacks into errors)",
        ops.len(),
        DType::ALL.len()
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_human_readable() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(32 << 10), "32 KiB");
        assert_eq!(size(128 << 20), "128 MiB");
        assert_eq!(size((1 << 31) - 1), "2.0 GiB");
        assert_eq!(size(3 << 29), "1.5 GiB");
        assert_eq!(size(u64::MAX), "unlimited");
    }

    #[test]
    fn cpu_runs_every_defined_op_natively() {
        for op in Op::catalogue() {
            for d in DType::ALL {
                let expected = if op.accepts(d) {
                    Support::Native
                } else {
                    Support::Undefined
                };
                assert!(support(&Device::cpu(), &op, d) == expected, "{}", op.name());
            }
        }
    }
}
