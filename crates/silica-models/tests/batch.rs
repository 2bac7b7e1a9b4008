//! `Llama::forward_batch` (several sequences in one pass, each over its
//! own KV cache) against each sequence run alone through `Llama::forward`,
//! on the CPU and every GPU adapter: a prompt step with sequences of
//! different lengths and cache fills, then decode steps where sequences join
//! and leave, as a server's continuous batching drives it.

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use silica_models::llama::{Llama, PickedStep, PoolStep, SeqStep};
use tiny_llama::{Tiny, TinyModelFile};

fn rows(t: &silica::Tensor) -> Vec<Vec<f32>> {
    let v = t.shape()[1];
    t.to_vec::<f32>()
        .unwrap()
        .chunks(v)
        .map(<[f32]>::to_vec)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The last-position logits of `ids` after `prefix`, alone.
fn alone(model: &Llama, prefix: &[u32], ids: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    if !prefix.is_empty() {
        model.forward(prefix, &mut cache, true).unwrap();
    }
    model
        .forward(ids, &mut cache, true)
        .unwrap()
        .to_vec()
        .unwrap()
}

#[test]
fn batched_sequences_match_each_alone() {
    let file = TinyModelFile::write_quantized("batch", &Tiny::quantized());
    for dev in tiny_llama::devices() {
        let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
        let model = Llama::load(&gguf, &dev, silica::DType::F32).unwrap();
        let prompts: [&[u32]; 3] = [
            &[301, 305, 309, 313, 302, 307],
            &[301, 304],
            &[301, 308, 308, 303, 330, 331, 332, 312, 306],
        ];
        let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
        // the third sequence has positions cached already
        model
            .forward(&[301, 302, 303], &mut caches[2], false)
            .unwrap();
        let mut steps: Vec<SeqStep> = prompts
            .iter()
            .zip(caches.iter_mut())
            .map(|(ids, cache)| SeqStep { ids, cache })
            .collect();
        let batched = rows(&model.forward_batch(&mut steps).unwrap());
        let prefixes: [&[u32]; 3] = [&[], &[], &[301, 302, 303]];
        for i in 0..3 {
            let want = alone(&model, prefixes[i], prompts[i]);
            let d = max_diff(&batched[i], &want);
            assert!(d < 2e-3, "{dev:?}: sequence {i} differs by {d}");
        }
        assert_eq!(
            caches.iter().map(|c| c.len()).collect::<Vec<_>>(),
            vec![6, 2, 12]
        );

        // decode steps: sequence 1 leaves, then sequence 0 and 2 go on
        let mut steps = vec![SeqStep {
            ids: &[340],
            cache: &mut caches[0],
        }];
        let out = rows(&model.forward_batch(&mut steps).unwrap());
        let want = alone(&model, &[301, 305, 309, 313, 302, 307], &[340]);
        assert!(
            max_diff(&out[0], &want) < 2e-3,
            "{dev:?}: a one-sequence step"
        );
        let (a, b) = caches.split_at_mut(2);
        let mut steps = vec![
            SeqStep {
                ids: &[341],
                cache: &mut a[0],
            },
            SeqStep {
                ids: &[342],
                cache: &mut b[0],
            },
        ];
        let out = rows(&model.forward_batch(&mut steps).unwrap());
        let want0 = alone(&model, &[301, 305, 309, 313, 302, 307, 340], &[341]);
        let want2 = alone(
            &model,
            &[301, 302, 303, 301, 308, 308, 303, 330, 331, 332, 312, 306],
            &[342],
        );
        assert!(
            max_diff(&out[0], &want0) < 2e-3,
            "{dev:?}: decode of sequence 0"
        );
        assert!(
            max_diff(&out[1], &want2) < 2e-3,
            "{dev:?}: decode of sequence 2"
        );

        // bad input leaves every cache as it was
        let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let (a, b) = caches.split_at_mut(1);
        let mut steps = vec![
            SeqStep {
                ids: &[303],
                cache: &mut a[0],
            },
            SeqStep {
                ids: &[u32::MAX],
                cache: &mut b[0],
            },
        ];
        let e = model.forward_batch(&mut steps).unwrap_err().to_string();
        assert!(e.contains("vocabulary"), "{e}");
        let mut steps = vec![SeqStep {
            ids: &[],
            cache: &mut caches[0],
        }];
        assert!(model.forward_batch(&mut steps).is_err());
        assert!(model.forward_batch(&mut []).is_err());
        assert_eq!(caches.iter().map(|c| c.len()).collect::<Vec<_>>(), before);
    }
}

/// `Llama::forward_pooled`: the same steps with the caches as slots of one
/// pool, a slot freed and taken again, and a sequence long enough to grow
/// the pool past its first 256 rows a slot (the others' rows are carried
/// over); every result against the sequence alone.
#[test]
fn pooled_sequences_match_each_alone() {
    let file = TinyModelFile::write_quantized("pool", &Tiny::quantized());
    for dev in tiny_llama::devices() {
        let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
        let model = Llama::load(&gguf, &dev, silica::DType::F32).unwrap();
        let mut pool = model.new_pool(3).unwrap();
        let slots: Vec<usize> = (0..3).map(|_| pool.acquire().unwrap()).collect();
        assert_eq!(pool.acquire(), None, "three slots");
        let prompts: [&[u32]; 3] = [
            &[301, 305, 309, 313, 302, 307],
            &[301, 304],
            &[301, 308, 308, 303, 330],
        ];
        let steps: Vec<PoolStep> = slots
            .iter()
            .zip(prompts)
            .map(|(&slot, ids)| PoolStep { slot, ids })
            .collect();
        let out = rows(&model.forward_pooled(&mut pool, &steps).unwrap());
        for i in 0..3 {
            let d = max_diff(&out[i], &alone(&model, &[], prompts[i]));
            assert!(d < 2e-3, "{dev:?}: prompt of sequence {i} differs by {d}");
        }
        // decode steps of every sequence, one token each (one kernel on a GPU)
        let mut history: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
        for t in 0..3u32 {
            let next: Vec<[u32; 1]> = (0..3).map(|i| [340 + 3 * t + i]).collect();
            let steps: Vec<PoolStep> = slots
                .iter()
                .zip(&next)
                .map(|(&slot, ids)| PoolStep { slot, ids })
                .collect();
            let out = rows(&model.forward_pooled(&mut pool, &steps).unwrap());
            for i in 0..3 {
                let want = alone(&model, &history[i], &next[i]);
                let d = max_diff(&out[i], &want);
                assert!(
                    d < 2e-3,
                    "{dev:?}: decode {t} of sequence {i} differs by {d}"
                );
                history[i].push(next[i][0]);
            }
        }
        // sequence 1 leaves; its slot takes a long prompt, which grows the pool
        pool.release(slots[1]);
        let slot = pool.acquire().unwrap();
        let long: Vec<u32> = (0..300).map(|i| 1 + (i * 7) % 500).collect();
        let steps = [
            PoolStep { slot, ids: &long },
            PoolStep {
                slot: slots[0],
                ids: &[377],
            },
        ];
        let out = rows(&model.forward_pooled(&mut pool, &steps).unwrap());
        assert!(pool.capacity() >= 300, "the pool grew");
        let d = max_diff(&out[0], &alone(&model, &[], &long));
        assert!(d < 2e-3, "{dev:?}: the long prompt differs by {d}");
        let d = max_diff(&out[1], &alone(&model, &history[0], &[377]));
        assert!(
            d < 2e-3,
            "{dev:?}: a sequence carried over the growth differs by {d}"
        );
        history[0].push(77);
        let steps = [
            PoolStep { slot, ids: &[305] },
            PoolStep {
                slot: slots[2],
                ids: &[306],
            },
        ];
        let out = rows(&model.forward_pooled(&mut pool, &steps).unwrap());
        assert!(
            max_diff(&out[0], &alone(&model, &long, &[305])) < 2e-3,
            "{dev:?}"
        );
        assert!(
            max_diff(&out[1], &alone(&model, &history[2], &[306])) < 2e-3,
            "{dev:?}"
        );

        // bad input leaves every slot as it was
        let before: Vec<usize> = (0..3).map(|s| pool.len(s)).collect();
        let bad = [
            PoolStep { slot, ids: &[303] },
            PoolStep {
                slot: slots[0],
                ids: &[u32::MAX],
            },
        ];
        let e = model
            .forward_pooled(&mut pool, &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("vocabulary"), "{e}");
        let twice = [
            PoolStep { slot, ids: &[303] },
            PoolStep { slot, ids: &[304] },
        ];
        assert!(model.forward_pooled(&mut pool, &twice).is_err());
        pool.release(slots[2]);
        let freed = [PoolStep {
            slot: slots[2],
            ids: &[303],
        }];
        assert!(model.forward_pooled(&mut pool, &freed).is_err());
        assert!(model.forward_pooled(&mut pool, &[]).is_err());
        assert_eq!(pool.len(slot), before[slot]);
        assert_eq!(pool.len(slots[0]), before[slots[0]]);
    }
}

/// A freed slot keeps its first positions for a prompt that starts with
/// the same tokens (`release_keeping`, `acquire_at`): the rest of that
/// prompt gives the logits the whole prompt gives alone, also after the
/// pool grew while the slot was free.
#[test]
fn kept_positions_serve_a_prompt_that_starts_the_same() {
    let file = TinyModelFile::write_quantized("keep", &Tiny::quantized());
    for dev in tiny_llama::devices() {
        let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
        let model = Llama::load(&gguf, &dev, silica::DType::F32).unwrap();
        let mut pool = model.new_pool(2).unwrap();
        let a = pool.acquire_at(0, 5).map(|_| 0).unwrap();
        assert_eq!(pool.len(a), 0, "a fresh slot keeps nothing");
        let first = [301u32, 305, 409, 313, 302, 307, 311, 304];
        let step = [PoolStep {
            slot: a,
            ids: &first,
        }];
        model.forward_pooled(&mut pool, &step).unwrap();
        pool.release_keeping(a, 6);
        assert!(!pool.in_use(a));
        assert_eq!((pool.kept(a), pool.len(a)), (6, 0));
        // the other slot grows the pool while `a` is free
        assert_eq!(pool.acquire_at(1, 0), Some(0));
        let long: Vec<u32> = (0..300).map(|i| 1 + (i * 7) % 500).collect();
        let step = [PoolStep {
            slot: 1,
            ids: &long,
        }];
        model.forward_pooled(&mut pool, &step).unwrap();
        assert!(pool.capacity() >= 300, "the pool grew");
        assert_eq!(pool.acquire_at(1, 0), None, "slot 1 is in use");
        assert_eq!(pool.acquire_at(2, 0), None, "there is no slot 2");
        // at most what it kept
        assert_eq!(pool.acquire_at(a, 100), Some(6));
        assert_eq!((pool.len(a), pool.kept(a)), (6, 0));
        let second = [301u32, 305, 409, 313, 302, 307, 320, 321];
        let step = [PoolStep {
            slot: a,
            ids: &second[6..],
        }];
        let out = rows(&model.forward_pooled(&mut pool, &step).unwrap());
        let d = max_diff(&out[0], &alone(&model, &[], &second));
        assert!(
            d < 2e-3,
            "{dev:?}: after kept positions the prompt differs by {d}"
        );
        // the long sequence carried over the growth too
        let step = [PoolStep {
            slot: 1,
            ids: &[303],
        }];
        let out = rows(&model.forward_pooled(&mut pool, &step).unwrap());
        assert!(
            max_diff(&out[0], &alone(&model, &long, &[303])) < 2e-3,
            "{dev:?}"
        );
        // a plain release forgets
        pool.release(a);
        assert_eq!(pool.kept(a), 0);
        assert_eq!(pool.acquire_at(a, 4), Some(0));
    }
}

/// Tokens fed from the device (the previous step's argmax, not read back)
/// give the logits the same tokens fed from the host give, beside a
/// sequence fed from the host in the same step; bad picks are refused and
/// leave the slots as they were.
#[test]
fn picked_tokens_match_host_tokens() {
    let file = TinyModelFile::write_quantized("picked", &Tiny::quantized());
    for dev in tiny_llama::devices() {
        let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
        let model = Llama::load(&gguf, &dev, silica::DType::F32).unwrap();
        let prompts: [&[u32]; 3] = [
            &[301, 305, 309, 313],
            &[301, 304],
            &[301, 308, 308, 303, 330],
        ];
        let (mut by_host, mut by_device) = (model.new_pool(3).unwrap(), model.new_pool(3).unwrap());
        let mut last = None;
        for pool in [&mut by_host, &mut by_device] {
            let steps: Vec<PoolStep> = prompts
                .iter()
                .map(|&ids| PoolStep {
                    slot: pool.acquire().unwrap(),
                    ids,
                })
                .collect();
            last = Some(model.forward_pooled(pool, &steps).unwrap());
        }
        let mut picks = last.unwrap().argmax(-1, false).unwrap();
        let mut host: Vec<u32> = picks.to_vec().unwrap();
        for round in 0..2 {
            // slot 1 from the host, slots 2 and 0 from the device
            let ids: Vec<[u32; 1]> = host.iter().map(|&t| [t]).collect();
            let steps: Vec<PoolStep> = [1, 2, 0]
                .iter()
                .map(|&slot| PoolStep {
                    slot,
                    ids: &ids[slot],
                })
                .collect();
            let want = rows(&model.forward_pooled(&mut by_host, &steps).unwrap());
            let picked = [
                PickedStep { slot: 2, row: 2 },
                PickedStep { slot: 0, row: 0 },
            ];
            let host_one = [PoolStep {
                slot: 1,
                ids: &ids[1],
            }];
            let got = model
                .forward_pooled_picked(&mut by_device, &host_one, &picked, Some(&picks))
                .unwrap();
            let got_rows = rows(&got);
            for (i, (g, w)) in got_rows.iter().zip(&want).enumerate() {
                let d = max_diff(g, w);
                assert!(d < 2e-3, "{dev:?}: round {round}, row {i} differs by {d}");
            }
            assert_eq!(
                (0..3).map(|s| by_device.len(s)).collect::<Vec<_>>(),
                (0..3).map(|s| by_host.len(s)).collect::<Vec<_>>()
            );
            // the next round's picks: this step's argmax, rows in slot order
            let order = silica::Tensor::from_vec(vec![2u32, 0, 1], &[3], &dev).unwrap();
            picks = got
                .argmax(-1, false)
                .unwrap()
                .index_select(0, &order)
                .unwrap();
            host = picks.to_vec().unwrap();
        }
        // every slot fed its own row, in order: the picks as they are
        let ids: Vec<[u32; 1]> = host.iter().map(|&t| [t]).collect();
        let steps: Vec<PoolStep> = (0..3)
            .map(|slot| PoolStep {
                slot,
                ids: &ids[slot],
            })
            .collect();
        let want = rows(&model.forward_pooled(&mut by_host, &steps).unwrap());
        let picked: Vec<PickedStep> = (0..3).map(|slot| PickedStep { slot, row: slot }).collect();
        let got = model
            .forward_pooled_picked(&mut by_device, &[], &picked, Some(&picks))
            .unwrap();
        for (i, (g, w)) in rows(&got).iter().zip(&want).enumerate() {
            let d = max_diff(g, w);
            assert!(d < 2e-3, "{dev:?}: in-order picks, row {i} differs by {d}");
        }
        let before: Vec<usize> = (0..3).map(|s| by_device.len(s)).collect();
        let t = silica::Tensor::from_vec(vec![3u32], &[1], &dev).unwrap();
        for (picked, picks) in [
            (vec![PickedStep { slot: 0, row: 1 }], Some(&t)),
            (vec![PickedStep { slot: 0, row: 0 }], None),
            (
                vec![
                    PickedStep { slot: 0, row: 0 },
                    PickedStep { slot: 0, row: 0 },
                ],
                Some(&t),
            ),
        ] {
            assert!(
                model
                    .forward_pooled_picked(&mut by_device, &[], &picked, picks)
                    .is_err()
            );
        }
        assert_eq!((0..3).map(|s| by_device.len(s)).collect::<Vec<_>>(), before);
    }
}

/// A pool whose steps' kernels were built ahead (as a server does before
/// it is ready: steps recorded while nothing runs, growing the pool) gives
/// the logits of a pool that was not: the buffers and RoPE tables the
/// build grew were made again for real. Before, they held undefined
/// values, and a GPU server's first answers were garbage.
#[test]
fn kernels_built_ahead_leave_the_pool_as_it_was() {
    let file = TinyModelFile::write_quantized("built", &Tiny::quantized());
    for dev in tiny_llama::devices().into_iter().filter(|d| d.is_gpu()) {
        let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
        let model = Llama::load(&gguf, &dev, silica::DType::F32).unwrap();
        let mut built = model.new_pool(2).unwrap();
        let before = built.capacity();
        model.build_pooled_kernels(&mut built, 300).unwrap();
        assert!(
            built.capacity() > before,
            "{dev:?}: the build grew the pool"
        );
        let mut plain = model.new_pool(2).unwrap();
        let prompt: &[u32] = &[301, 305, 309, 313, 302, 307];
        let mut outs = Vec::new();
        for pool in [&mut built, &mut plain] {
            let slot = pool.acquire().unwrap();
            let first = model.forward_pooled(pool, &[PoolStep { slot, ids: prompt }]);
            let next = model.forward_pooled(pool, &[PoolStep { slot, ids: &[340] }]);
            outs.push((rows(&first.unwrap()), rows(&next.unwrap())));
        }
        let (a, b) = (&outs[0], &outs[1]);
        let d = max_diff(&a.0[0], &b.0[0]).max(max_diff(&a.1[0], &b.1[0]));
        assert!(d < 1e-5, "{dev:?}: the logits differ by {d}");
    }
}
