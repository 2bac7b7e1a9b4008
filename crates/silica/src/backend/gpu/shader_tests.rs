//! Every WGSL kernel, in every specialization its launcher can ask for,
//! must parse, validate and translate with naga to MSL (the Metal path,
//! which cannot be run here) and to SPIR-V (the Vulkan path).

use super::runtime::kernel_source;
use super::{Kernel, copy, elementwise, matmul, nn, qmatmul, reduce};
use std::borrow::Cow;

pub(super) fn all() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut v = elementwise::specializations();
    v.extend(reduce::specializations());
    v.extend(matmul::specializations());
    v.extend(copy::specializations());
    v.extend(nn::specializations());
    v.extend(qmatmul::specializations());
    v
}

/// The kernel's module (see `kernel_source`), parsed and validated.
pub(super) fn parse(
    kernel: &Kernel,
    immediates: bool,
    subgroups: bool,
) -> (naga::Module, naga::valid::ModuleInfo) {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let source = kernel_source(kernel, immediates, subgroups);
    let module = naga::front::wgsl::parse_str(&source)
        .unwrap_or_else(|e| panic!("{}: {}", kernel.name, e.emit_to_string(&source)));
    let info = Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", kernel.name, e.emit_to_string(&source)));
    (module, info)
}

/// The module with its override constants set, as a pipeline would build
/// it (`what` names it in a failure).
pub(super) fn specialize<'a>(
    module: &'a naga::Module,
    info: &'a naga::valid::ModuleInfo,
    constants: &[(&'static str, f64)],
    what: &str,
) -> (Cow<'a, naga::Module>, Cow<'a, naga::valid::ModuleInfo>) {
    let mut pc = naga::back::PipelineConstants::default();
    for (k, v) in constants {
        pc.insert(k.to_string(), *v);
    }
    naga::back::pipeline_constants::process_overrides(
        module,
        info,
        Some((naga::ShaderStage::Compute, "main")),
        &pc,
    )
    .unwrap_or_else(|e| panic!("{what}: overrides: {e}"))
}

/// `module` translated to MSL and to SPIR-V as a device would build it:
/// the MSL source and the SPIR-V words, checked to be a kernel and SPIR-V.
fn translate(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    what: &str,
) -> (String, Vec<u32>) {
    use naga::back::{msl, spv};
    let msl_options = msl::Options {
        lang_version: (2, 4),
        ..Default::default()
    };
    let msl_pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, "main".into())),
        ..Default::default()
    };
    let (msl_src, _) = msl::write_string(module, info, &msl_options, &msl_pipeline)
        .unwrap_or_else(|e| panic!("{what}: MSL: {e}"));
    assert!(msl_src.contains("kernel void"), "{what}: no MSL kernel");
    let spv_pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = spv::write_vec(module, info, &spv::Options::default(), Some(&spv_pipeline))
        .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
    assert_eq!(words[0], 0x0723_0203, "{what}: not SPIR-V");
    (msl_src, words)
}

#[test]
fn every_kernel_translates_to_msl_and_spirv() {
    let mut parsed = std::collections::HashMap::new();
    let mut count = 0;
    for (kernel, constants) in all() {
        // each module once more with its parameters in immediate data
        // (the form used where the adapter has room for them), translated
        // with the constants of its first specialization; the kernels that
        // reduce rows also in their subgroup form, with every constant set
        let subgroup_form = kernel_source(kernel, false, true) != kernel.source;
        let mut variants = vec![(false, false)];
        if kernel.immediates && !parsed.contains_key(&(kernel.name, false, false)) {
            variants.push((true, false));
        }
        if subgroup_form {
            variants.push((false, true));
        }
        for (immediates, subgroups) in variants {
            let key = (kernel.name, immediates, subgroups);
            let (module, info) = parsed.entry(key).or_insert_with(|| {
                let source = kernel_source(kernel, immediates, subgroups);
                assert!(
                    !immediates || source.contains("var<immediate> p:"),
                    "{}: no parameter block to move to immediates",
                    kernel.name
                );
                assert!(!subgroups || source.contains("subgroupAdd"));
                parse(kernel, immediates, subgroups)
            });
            let what = format!(
                "{} {constants:?} immediates: {immediates} subgroups: {subgroups}",
                kernel.name
            );
            let (m, i) = specialize(module, info, &constants, &what);
            let (msl_src, words) = translate(&m, &i, &what);
            if kernel.name == "matmul_coop8" {
                // Metal's one shape of simdgroup matrix, with half operands
                // loaded through pointers to halves
                for needle in [
                    "simdgroup_half8x8",
                    "simdgroup_float8x8",
                    "NagaCooperativeLoad(const threadgroup half* ptr",
                    "simdgroup_multiply_accumulate",
                ] {
                    assert!(msl_src.contains(needle), "{what}: no {needle} in the MSL");
                }
                assert!(
                    !msl_src.contains("16x16"),
                    "{what}: 16x16 matrices in the MSL"
                );
            }
            // SILICA_DUMP_MSL=DIR keeps each kernel's MSL (its last
            // specialization) for reading
            if let Ok(dir) = std::env::var("SILICA_DUMP_MSL") {
                std::fs::write(format!("{dir}/{}.metal", kernel.name), &msl_src).unwrap();
            }
            // SILICA_DUMP_SPIRV=DIR keeps each kernel's SPIR-V (its last
            // specialization), for spirv-dis
            if let Ok(dir) = std::env::var("SILICA_DUMP_SPIRV") {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                std::fs::write(format!("{dir}/{}.spv", kernel.name), bytes).unwrap();
            }
            count += 1;
        }
    }
    println!("{count} kernel specializations translated to MSL and SPIR-V");
    assert!(count > 500);
}

#[test]
fn the_kernels_parsed_ahead_are_every_kernel() {
    let listed: std::collections::BTreeSet<&str> =
        super::every_kernel().iter().map(|k| k.name).collect();
    let all: std::collections::BTreeSet<&str> = all().iter().map(|(k, _)| k.name).collect();
    assert_eq!(listed, all);
    assert_eq!(
        listed.len(),
        super::every_kernel().len(),
        "a kernel listed twice"
    );
}

/// The WGSL of custom-op kernels (the library's own, and the example's)
/// parses, validates and translates to MSL and SPIR-V as the built-in
/// kernels do.
#[test]
fn custom_op_kernels_translate_to_msl_and_spirv() {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let sources = [
        ("head_norm", include_str!("kernels/head_norm.wgsl")),
        ("low_rank_in", include_str!("kernels/low_rank_in.wgsl")),
        (
            "lora_delta",
            include_str!("../../../examples/lora_delta.wgsl"),
        ),
    ];
    for (name, source) in sources {
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        let info = Validator::new(ValidationFlags::all(), Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        translate(&module, &info, name);
    }
}
