//! What the Vulkan driver made of each kernel: registers, workgroup memory,
//! spills and whatever else it reports through
//! `VK_KHR_pipeline_executable_properties` (NVIDIA reports a register
//! count, Mesa's drivers their own figures). These numbers decide how many
//! workgroups share an SM, which no timing shows directly.
//!
//! An ignored test, run on demand on the machine whose driver is wanted:
//!
//! ```sh
//! SILICA_STATS_FILTER=qgemv_i8 cargo test --release -p silica --lib \
//!     pipeline_statistics -- --ignored --nocapture
//! ```
//!
//! `SILICA_STATS_FILTER` keeps the specializations whose name and constants
//! (as printed) contain the text. `SILICA_STATS_DUMP=DIR` also writes each
//! one's SPIR-V (`N.spv`) and the driver's pipeline cache after building it
//! (`N.cache`, where a driver keeps its machine code) into DIR. Each is translated as the Vulkan backend
//! of wgpu translates it on a Vulkan 1.3 device (SPIR-V 1.6, subgroup
//! forms, bounds checks only for untrusted kernels), with its parameters in
//! the uniform buffer rather than in immediates.

use super::shader_tests::{all, parse, specialize};
use ash::vk;

/// The driver's statistics of one pipeline, one line an executable.
fn statistics(
    ext: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> Vec<String> {
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: the pipeline was created on this device with the capture flag
    let props =
        unsafe { ext.get_pipeline_executable_properties(&info) }.expect("executable properties");
    let mut lines = Vec::new();
    for (index, p) in props.iter().enumerate() {
        let exec = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(index as u32);
        // SAFETY: as above, index < the count the driver gave
        let stats = unsafe { ext.get_pipeline_executable_statistics(&exec) }
            .expect("executable statistics");
        let mut line = p
            .name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for s in &stats {
            let name = s.name_as_c_str().map(|n| n.to_string_lossy().into_owned());
            // SAFETY: the union's member is the one `format` names
            let value = unsafe {
                match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                        (s.value.b32 != 0).to_string()
                    }
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64.to_string(),
                    _ => "?".into(),
                }
            };
            line += &format!("; {}: {value}", name.unwrap_or_default());
        }
        lines.push(line);
    }
    lines
}

#[test]
#[ignore = "needs a Vulkan driver with VK_KHR_pipeline_executable_properties; run on demand"]
fn pipeline_statistics() {
    use naga::back::spv;

    let filter = std::env::var("SILICA_STATS_FILTER").unwrap_or_default();
    let dump = std::env::var_os("SILICA_STATS_DUMP").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).expect("the dump folder");
    }
    // SAFETY: loading the system's Vulkan loader
    let entry = unsafe { ash::Entry::load() }.expect("a Vulkan loader");
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    // SAFETY: plain instance, device and pipeline creation with valid
    // create-infos; every object is destroyed before its parent
    unsafe {
        let instance = entry
            .create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )
            .expect("a Vulkan instance");
        let pds = instance
            .enumerate_physical_devices()
            .expect("physical devices");
        // the first discrete GPU, else the first device
        let pd = *pds
            .iter()
            .find(|&&pd| {
                instance.get_physical_device_properties(pd).device_type
                    == vk::PhysicalDeviceType::DISCRETE_GPU
            })
            .or(pds.first())
            .expect("a Vulkan device");
        let props = instance.get_physical_device_properties(pd);
        let name = props
            .device_name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let available = instance
            .enumerate_device_extension_properties(pd)
            .expect("device extensions");
        let has = |ext: &std::ffi::CStr| {
            available
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(ext))
        };
        // without the extension the pipelines are still built (each
        // specialization must compile on the driver), with no figures
        let stats_ext = ash::khr::pipeline_executable_properties::NAME;
        let with_stats = has(stats_ext);
        if !with_stats {
            println!("{name}: no {stats_ext:?}; pipelines built without statistics");
        }
        let mut exts = Vec::new();
        if with_stats {
            exts.push(stats_ext.as_ptr());
        }
        let coop_ext = ash::khr::cooperative_matrix::NAME;
        let coop = has(coop_ext);
        if coop {
            exts.push(coop_ext.as_ptr());
        }
        // every feature the device has, so that any capability the SPIR-V
        // declares is enabled
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut fexec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut fcoop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13);
        if with_stats {
            features = features.push_next(&mut fexec);
        }
        if coop {
            features = features.push_next(&mut fcoop);
        }
        instance.get_physical_device_features2(pd, &mut features);
        let family = instance
            .get_physical_device_queue_family_properties(pd)
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .expect("a compute queue") as u32;
        let queue = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&[1.0])];
        let device = instance
            .create_device(
                pd,
                &vk::DeviceCreateInfo::default()
                    .queue_create_infos(&queue)
                    .enabled_extension_names(&exts)
                    .push_next(&mut features),
                None,
            )
            .expect("a Vulkan device with pipeline statistics");
        let ext = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
        println!("{name} (driver {:#x})", props.driver_version);

        let mut parsed = std::collections::HashMap::new();
        let mut count = 0;
        for (kernel, constants) in all() {
            let what = format!("{} {constants:?}", kernel.name);
            let needs_coop = kernel.source.contains("enable wgpu_cooperative_matrix");
            if !what.contains(filter.as_str()) || (needs_coop && !coop) {
                continue;
            }
            let (module, info) = parsed
                .entry(kernel.name)
                .or_insert_with(|| parse(kernel, false, true));
            let (m, i) = specialize(module, info, &constants, &what);
            let checked = if kernel.trusted {
                naga::proc::BoundsCheckPolicy::Unchecked
            } else {
                naga::proc::BoundsCheckPolicy::Restrict
            };
            let options = spv::Options {
                lang_version: (1, 6),
                bounds_check_policies: naga::proc::BoundsCheckPolicies {
                    index: checked,
                    buffer: naga::proc::BoundsCheckPolicy::Unchecked,
                    image_load: naga::proc::BoundsCheckPolicy::Unchecked,
                    binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
                },
                zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
                force_loop_bounding: !kernel.trusted,
                ..Default::default()
            };
            let pipeline_options = spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: "main".into(),
            };
            let words = spv::write_vec(&m, &i, &options, Some(&pipeline_options)).expect("SPIR-V");
            let shader = device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .expect("a shader module");
            // binding 0 the parameters, then the inputs and the outputs
            let bindings: Vec<_> = (0..1 + kernel.inputs + kernel.outputs)
                .map(|b| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b as u32)
                        .descriptor_type(if b == 0 {
                            vk::DescriptorType::UNIFORM_BUFFER
                        } else {
                            vk::DescriptorType::STORAGE_BUFFER
                        })
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let set_layout = device
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .expect("a set layout");
            let sets = [set_layout];
            let layout = device
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default().set_layouts(&sets),
                    None,
                )
                .expect("a pipeline layout");
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(shader)
                .name(c"main");
            let create = [vk::ComputePipelineCreateInfo::default()
                .flags(if with_stats {
                    vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                } else {
                    vk::PipelineCreateFlags::empty()
                })
                .stage(stage)
                .layout(layout)];
            // with SILICA_STATS_DUMP, each pipeline's SPIR-V and the
            // driver's cache of it (where NVIDIA keeps the machine code)
            let cache = match &dump {
                Some(_) => device
                    .create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)
                    .expect("a pipeline cache"),
                None => vk::PipelineCache::null(),
            };
            let pipeline = device
                .create_compute_pipelines(cache, &create, None)
                .map_err(|(_, e)| e)
                .unwrap_or_else(|e| panic!("{what}: pipeline: {e}"))[0];
            if with_stats {
                for line in statistics(&ext, pipeline) {
                    println!("{what}: {line}");
                }
            }
            if let Some(dir) = &dump {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                std::fs::write(dir.join(format!("{count}.spv")), bytes).expect("SPIR-V written");
                let data = device.get_pipeline_cache_data(cache).expect("cache data");
                std::fs::write(dir.join(format!("{count}.cache")), data).expect("cache written");
                println!("{what}: dumped as {count}");
                device.destroy_pipeline_cache(cache, None);
            }
            device.destroy_pipeline(pipeline, None);
            device.destroy_pipeline_layout(layout, None);
            device.destroy_descriptor_set_layout(set_layout, None);
            device.destroy_shader_module(shader, None);
            count += 1;
        }
        device.destroy_device(None);
        instance.destroy_instance(None);
        println!("{count} specializations");
        assert!(count > 0, "no specialization matches {filter:?}");
    }
}
