//! Sampling on the device (`sampling::draw_rows`): every GPU adapter draws
//! the tokens the CPU draws for the same keys and counters, and greedy rows
//! beside sampled ones keep their argmax.

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use silica::{DType, Tensor};
use silica_models::sampling::{Penalties, RowDraw, draw_rows, penalize, penalize_rows, row_cuts};

/// Standard normal logits times `scale` on the CPU, from `seed`.
fn logits_on_cpu(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    Tensor::randn(shape, DType::F32, seed, &silica::Device::cpu())
        .unwrap()
        .mul_scalar(scale)
        .unwrap()
}

#[test]
fn every_device_draws_the_cpu_tokens() {
    let (rows, vocab) = (48usize, 3000usize);
    let logits = logits_on_cpu(&[rows, vocab], 5, 3.0);
    let draws: Vec<RowDraw> = (0..rows as u64)
        .map(|r| {
            if r % 5 == 0 {
                RowDraw::argmax()
            } else {
                // every fourth row cut by top-k, top-p or min-p (or all)
                let cut = [
                    (0, 1.0, 0.0),
                    (40, 1.0, 0.0),
                    (0, 0.9, 0.0),
                    (0, 1.0, 0.05),
                    (50, 0.8, 0.02),
                ];
                let (top_k, top_p, min_p) = if r % 4 == 0 {
                    cut[(r / 4 % 5) as usize]
                } else {
                    (0, 1.0, 0.0)
                };
                RowDraw {
                    inv_temperature: 1.0 / (0.3 + 0.1 * (r % 9) as f32),
                    key: 1000 + r / 3,
                    counter: r,
                    top_k,
                    top_p,
                    min_p,
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
    // the cuts keep what they should on the CPU: top-k exactly k entries
    let cuts: Vec<f32> = row_cuts(&logits, &draws).unwrap().to_vec().unwrap();
    let l: Vec<f32> = logits.to_vec().unwrap();
    let kept = |r: usize, cut: f32| {
        let inv_t = draws[r].inv_temperature;
        l[r * vocab..(r + 1) * vocab]
            .iter()
            .filter(|&&v| v * inv_t >= cut)
            .count()
    };
    for (r, d) in draws.iter().enumerate() {
        if d.top_k > 0 && d.top_p >= 1.0 && d.min_p <= 0.0 {
            assert_eq!(kept(r, cuts[r]), d.top_k as usize, "row {r}");
        }
        if d.top_k == 0 && d.top_p >= 1.0 && d.min_p <= 0.0 {
            assert_eq!(cuts[r], f32::NEG_INFINITY, "row {r}");
        }
    }
    for dev in tiny_llama::devices().into_iter().skip(1) {
        let l = logits.to_device(&dev).unwrap();
        let got_cuts: Vec<f32> = row_cuts(&l, &draws).unwrap().to_vec().unwrap();
        for r in 0..rows {
            assert_eq!(
                kept(r, got_cuts[r]),
                kept(r, cuts[r]),
                "{dev:?}: row {r} cut at {} against {}",
                got_cuts[r],
                cuts[r]
            );
        }
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

/// `generate` with a temperature alone draws its tokens on the device:
/// the same seed gives the same tokens, the draws are those of
/// `draw_rows` over each step's logits with the token's index as counter
/// (the steps queued ahead on a GPU included), and another seed draws
/// others.
#[test]
fn generation_at_a_temperature_draws_on_the_device() {
    use silica_models::generate::generate;
    use silica_models::sampling::{Sampler, SamplingParams};
    let file = tiny_llama::TinyModelFile::write_quantized("draw", &tiny_llama::Tiny::quantized());
    let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
    let tok = silica_models::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    // (the tiny model's logits are far apart: a high temperature makes the
    // draws vary)
    let params = |seed| SamplingParams {
        temperature: 40.0,
        seed,
        ..SamplingParams::greedy()
    };
    let prompt = tok.encode("a b c d", true).unwrap();
    for dev in tiny_llama::devices() {
        let model = silica_models::llama::Llama::load(&gguf, &dev, DType::F32).unwrap();
        let run = |seed| {
            let mut sampler = Sampler::new(params(seed));
            assert!(sampler.device_draw(0).is_some());
            generate(&model, &tok, &prompt, &mut sampler, 12, &[], |_| {
                std::ops::ControlFlow::Continue(())
            })
            .unwrap()
            .tokens
        };
        let a = run(5);
        assert_eq!(a.len(), 12, "{dev:?}");
        assert_eq!(a, run(5), "{dev:?}: the same seed");
        assert_ne!(a, run(6), "{dev:?}: another seed");
        // replayed one step at a time
        let mut cache = model.new_cache();
        let mut logits = model.forward(&prompt, &mut cache, true).unwrap();
        for (k, &t) in a.iter().enumerate() {
            let draw = Sampler::new(params(5)).device_draw(k as u64).unwrap();
            let got: Vec<u32> = draw_rows(&logits, &[draw]).unwrap().to_vec().unwrap();
            assert_eq!(got[0], t, "{dev:?}: token {k}");
            logits = model.forward(&[t], &mut cache, true).unwrap();
        }
    }
}

/// The draw's and the penalty's kernels parse, validate and translate to
/// MSL (Metal) and SPIR-V, as the library's own kernels do.
#[test]
fn the_draw_kernels_translate_to_msl_and_spirv() {
    use naga::back::{msl, spv};
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let sources = [
        ("gumbel", include_str!("../src/sampling/gumbel.wgsl")),
        ("row_cut", include_str!("../src/sampling/row_cut.wgsl")),
        (
            "penalty_count",
            include_str!("../src/sampling/penalty_count.wgsl"),
        ),
        (
            "penalty_apply",
            include_str!("../src/sampling/penalty_apply.wgsl"),
        ),
    ];
    for (name, source) in sources {
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        let info = Validator::new(ValidationFlags::all(), Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        let msl_options = msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        let msl_pipeline = msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
            ..Default::default()
        };
        let (src, _) = msl::write_string(&module, &info, &msl_options, &msl_pipeline).unwrap();
        assert!(src.contains("kernel void"), "{name}: {src}");
        let spv_pipeline = spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        };
        let words = spv::write_vec(
            &module,
            &info,
            &spv::Options::default(),
            Some(&spv_pipeline),
        )
        .unwrap();
        assert_eq!(words[0], 0x0723_0203, "{name}");
    }
}

/// Many rows of a larger vocabulary: each workgroup of the cut search
/// walks several steps of its row (130 rows of 5,000 share one workgroup a
/// row), and every device keeps what the CPU keeps, with every kind of cut
/// in the batch and with only top-k, only top-p or only min-p in it (the
/// searches no row asks for are not dispatched).
#[test]
fn cuts_of_many_rows_keep_what_the_cpu_keeps() {
    let (rows, vocab) = (130usize, 5000usize);
    let logits = logits_on_cpu(&[rows, vocab], 11, 2.0);
    let mixed: Vec<RowDraw> = (0..rows as u64)
        .map(|r| RowDraw {
            inv_temperature: 1.0 / (0.5 + 0.1 * (r % 7) as f32),
            key: r,
            counter: 0,
            top_k: [0, 1, 40, 300][r as usize % 4],
            top_p: [1.0, 0.9, 0.5][r as usize % 3],
            min_p: [0.0, 0.0, 0.05][r as usize % 3],
        })
        .collect();
    let only = |k: bool, p: bool, m: bool| -> Vec<RowDraw> {
        mixed
            .iter()
            .map(|d| RowDraw {
                top_k: if k { d.top_k.max(1) } else { 0 },
                top_p: if p { d.top_p.min(0.8) } else { 1.0 },
                min_p: if m { 0.05 } else { 0.0 },
                ..*d
            })
            .collect()
    };
    for draws in [
        mixed.clone(),
        only(true, false, false),
        only(false, true, false),
        only(false, false, true),
    ] {
        cuts_agree(&logits, &draws, vocab);
    }
}

/// The mass (f64) of the `n` most likely entries of `row` after `d`'s
/// top-k, and top_p of the mass top-k keeps.
fn top_p_masses(row: &[f32], d: &RowDraw, n: usize) -> (f64, f64) {
    let mut s: Vec<f64> = row
        .iter()
        .map(|&x| (x * d.inv_temperature) as f64)
        .collect();
    s.sort_by(|a, b| b.total_cmp(a));
    let m = s[0];
    let k = if d.top_k > 0 {
        (d.top_k as usize).min(s.len())
    } else {
        s.len()
    };
    let e: Vec<f64> = s[..k].iter().map(|x| (x - m).exp()).collect();
    (e[..n].iter().sum(), d.top_p as f64 * e.iter().sum::<f64>())
}

/// Every device's cuts of `draws` over `logits` keep what the CPU's keep.
fn cuts_agree(logits: &Tensor, draws: &[RowDraw], vocab: usize) {
    let rows = draws.len();
    let l: Vec<f32> = logits.to_vec().unwrap();
    let kept = |r: usize, cut: f32| {
        let inv_t = draws[r].inv_temperature;
        l[r * vocab..(r + 1) * vocab]
            .iter()
            .filter(|&&v| v * inv_t >= cut)
            .count()
    };
    let want: Vec<f32> = row_cuts(logits, draws).unwrap().to_vec().unwrap();
    for dev in tiny_llama::devices().into_iter().skip(1) {
        let got: Vec<f32> = row_cuts(&logits.to_device(&dev).unwrap(), draws)
            .unwrap()
            .to_vec()
            .unwrap();
        for r in 0..rows {
            let (a, b) = (kept(r, got[r]), kept(r, want[r]));
            if a != b {
                // a top-p cut may differ by the one entry whose mass brings
                // the sum to top_p of the total within the roundings of
                // sums taken in another order
                let n = a.min(b);
                let (reached, goal) = top_p_masses(&l[r * vocab..(r + 1) * vocab], &draws[r], n);
                assert!(
                    a.abs_diff(b) == 1 && (reached - goal).abs() <= 1e-5 * goal,
                    "{dev:?}: row {r} keeps {a} against {b} (mass {reached} of {goal})"
                );
            }
        }
    }
}

/// The repetition penalty on every device gives the CPU's logits, and a
/// GPU's `generate` with a penalty picks its tokens there: replayed step by
/// step (penalty over the prompt and the tokens so far, then the draw)
/// they are the same, greedy and at a temperature.
#[test]
fn generation_with_a_repetition_penalty_picks_on_a_gpu() {
    use silica_models::generate::generate;
    use silica_models::sampling::{Sampler, SamplingParams};
    let vocab = 3000;
    let logits = logits_on_cpu(&[1, vocab], 21, 3.0);
    let seen: Vec<u32> = (0..400).map(|i| (i * 37 % 700) as u32).collect();
    let flight = Tensor::from_vec(vec![5u32], &[1], &silica::Device::cpu()).unwrap();
    let want: Vec<f32> = penalize(&logits, &seen, Some(&flight), 1.3)
        .unwrap()
        .to_vec()
        .unwrap();
    for dev in tiny_llama::devices().into_iter().skip(1) {
        let f = flight.to_device(&dev).unwrap();
        let got: Vec<f32> = penalize(&logits.to_device(&dev).unwrap(), &seen, Some(&f), 1.3)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(got, want, "{dev:?}");
    }
    let file =
        tiny_llama::TinyModelFile::write_quantized("penalty", &tiny_llama::Tiny::quantized());
    let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
    let tok = silica_models::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let prompt = tok.encode("a b c d", true).unwrap();
    for dev in tiny_llama::devices().into_iter().filter(|d| d.is_gpu()) {
        let model = silica_models::llama::Llama::load(&gguf, &dev, DType::F32).unwrap();
        let cases = [
            (0.0, 1.5, 0.0, 0.0),
            (40.0, 1.5, 0.0, 0.0),
            (0.0, 1.2, 0.7, 0.4),
            (40.0, 1.0, 0.5, 1.5),
        ];
        for (temperature, repetition, frequency, presence) in cases {
            let params = SamplingParams {
                temperature,
                repetition_penalty: repetition,
                frequency_penalty: frequency,
                presence_penalty: presence,
                seed: 3,
                ..SamplingParams::greedy()
            };
            let pens = Penalties {
                repetition,
                frequency,
                presence,
            };
            let sampler = Sampler::new(params.clone());
            let (row, penalty) = sampler.device_pick_on(0, &dev).expect("a GPU pick");
            assert_eq!(penalty, Some(pens));
            let tokens = generate(
                &model,
                &tok,
                &prompt,
                &mut Sampler::new(params.clone()),
                12,
                &[],
                |_| std::ops::ControlFlow::Continue(()),
            )
            .unwrap()
            .tokens;
            assert_eq!(tokens.len(), 12, "{dev:?}");
            let mut cache = model.new_cache();
            let mut history = prompt.clone();
            let mut l = model.forward(&prompt, &mut cache, true).unwrap();
            for (k, &t) in tokens.iter().enumerate() {
                let draw = RowDraw {
                    counter: k as u64,
                    ..row
                };
                let p = penalize_rows(&l, &[&history], None, &[pens]).unwrap();
                let got: Vec<u32> = draw_rows(&p, &[draw]).unwrap().to_vec().unwrap();
                assert_eq!(got[0], t, "{dev:?}, {pens:?}, T {temperature}: token {k}");
                history.push(t);
                l = model.forward(&[t], &mut cache, true).unwrap();
            }
        }
    }
}

/// Rows with their own penalties, histories and tokens in flight: every
/// device gives the CPU's logits (the same roundings: the repetition
/// penalty's power as products, then the subtraction), and a greedy pick
/// after them is the host sampler's over the history and the token in
/// flight.
#[test]
fn row_penalties_match_the_cpu_on_every_device() {
    use silica_models::sampling::{Sampler, SamplingParams};
    let (rows, vocab) = (6, 3000);
    let cpu = silica::Device::cpu();
    let logits = logits_on_cpu(&[rows, vocab], 22, 3.0);
    let histories: Vec<Vec<u32>> = (0..rows)
        .map(|r| {
            (0..300 + 50 * r)
                .map(|i| ((i * (31 + r)) % 500) as u32)
                .collect()
        })
        .collect();
    let seen: Vec<&[u32]> = histories.iter().map(Vec::as_slice).collect();
    let pens: Vec<Penalties> = (0..rows)
        .map(|r| match r % 3 {
            0 => Penalties {
                repetition: 1.3,
                ..Penalties::NONE
            },
            1 => Penalties {
                repetition: 1.1,
                frequency: 0.4,
                presence: 0.6,
            },
            _ => Penalties::NONE,
        })
        .collect();
    // the previous step's picks, rows 1, 2 and 4 feeding one each
    let picks = Tensor::from_vec(vec![17u32, 5, 2999, 40], &[4], &cpu).unwrap();
    let flight = [(1u32, 1u32), (3, 2), (2, 4)];
    let want: Vec<f32> = penalize_rows(&logits, &seen, Some((&picks, &flight)), &pens)
        .unwrap()
        .to_vec()
        .unwrap();
    let l: Vec<f32> = logits.to_vec().unwrap();
    for (r, p) in pens.iter().enumerate() {
        let mut history = histories[r].clone();
        if let Some(&(pick, _)) = flight.iter().find(|f| f.1 as usize == r) {
            history.push([17u32, 5, 2999, 40][pick as usize]);
        }
        let mut host = Sampler::new(SamplingParams {
            repetition_penalty: p.repetition,
            frequency_penalty: p.frequency,
            presence_penalty: p.presence,
            ..SamplingParams::greedy()
        });
        let row = &want[r * vocab..(r + 1) * vocab];
        let best = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap();
        let host_pick = host.sample(&l[r * vocab..(r + 1) * vocab], &history);
        assert_eq!(host_pick, best as u32, "row {r}");
    }
    for dev in tiny_llama::devices().into_iter().skip(1) {
        let p = picks.to_device(&dev).unwrap();
        let got: Vec<f32> = penalize_rows(
            &logits.to_device(&dev).unwrap(),
            &seen,
            Some((&p, &flight)),
            &pens,
        )
        .unwrap()
        .to_vec()
        .unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{dev:?}: entry {i}: {g} against {w}"
            );
        }
    }
}
