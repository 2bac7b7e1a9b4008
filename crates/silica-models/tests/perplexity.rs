//! `silica_models::perplexity` on the tiny random Llama of
//! tests/common/tiny_llama.rs: the perplexity of a run against a direct
//! computation, a run compared with its own saved logits (KL divergence
//! about 0, top-1 agreement 100%) on the CPU and every GPU adapter, another
//! path that does diverge, saved files that must be refused (another
//! token sequence, truncated, foreign or corrupt), and llama.cpp's file
//! format written and read.

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use std::path::{Path, PathBuf};

use silica::{DType, Device};
use silica_models::Error;
use silica_models::gguf::GgufFile;
use silica_models::llama::Llama;
use silica_models::perplexity::{
    self, BaseRow, Evaluation, LogitsHeader, LogitsReader, LogitsWriter, Mode, Windows,
};
use silica_models::tokenizer::Tokenizer;
use tiny_llama::{Tiny, TinyModelFile};

/// Window length of the tests: small, so that a run takes milliseconds.
const CTX: usize = 32;

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("perplexity_{name}"))
}

/// The tiny quantized model in a folder of its own (`tag`: one per test,
/// since the folder goes when the file is dropped).
fn model_file(tag: &str) -> TinyModelFile {
    TinyModelFile::write_quantized(&format!("perplexity-{tag}"), &Tiny::quantized())
}

fn load(file: &TinyModelFile, dev: &Device, dtype: DType) -> Llama {
    Llama::load(&GgufFile::open(&file.path).unwrap(), dev, dtype).unwrap()
}

/// BOS, then `n` pseudo-random ordinary tokens of the tiny vocabulary.
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    let mut t = vec![1];
    t.extend((0..n).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        260 + x % 252
    }));
    t
}

fn run(model: &Llama, tokens: &[u32], w: &Windows, mode: Mode<'_>) -> Result<Evaluation, Error> {
    perplexity::evaluate(model, tokens, w, Some(1), mode, |_| {})
}

/// Saves a run of `model` over `tokens` to `path`.
fn save(model: &Llama, tokens: &[u32], w: &Windows, path: &Path) -> Evaluation {
    let header = LogitsHeader::new(tokens, *w, model.config.vocab_size, "tiny test model");
    let mut writer = LogitsWriter::create(path, header).unwrap();
    let eval = run(model, tokens, w, Mode::Save(&mut writer)).unwrap();
    writer.finish().unwrap();
    eval
}

/// The mean negative log-likelihood of the scored positions, computed
/// directly: each window from an empty cache, BOS first, softmax in f64.
fn direct_mean_nll(model: &Llama, tokens: &[u32], w: &Windows) -> f64 {
    let vocab = model.config.vocab_size;
    let (mut sum, mut n) = (0.0, 0);
    for i in 0..w.count {
        let start = i * w.step;
        let mut ids = tokens[start..start + w.ctx].to_vec();
        ids[0] = 1;
        let mut cache = model.new_cache();
        let logits: Vec<f32> = model
            .forward(&ids, &mut cache, false)
            .unwrap()
            .to_vec()
            .unwrap();
        for j in w.first..w.ctx - 1 {
            let row = &logits[j * vocab..(j + 1) * vocab];
            let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
            let next = tokens[start + j + 1] as usize;
            sum -= (f64::from(row[next]).exp() / z).ln();
            n += 1;
        }
    }
    assert_eq!(n, w.positions());
    sum / n as f64
}

#[test]
fn perplexity_matches_a_direct_computation() {
    let file = model_file("t1");
    let model = load(&file, &Device::cpu(), DType::F32);
    let t = tokens(150, 1);
    for w in [
        Windows::chunks(t.len(), CTX, None).unwrap(),
        Windows::strided(t.len(), CTX, 8, None).unwrap(),
    ] {
        let mut seen = Vec::new();
        let eval = perplexity::evaluate(&model, &t, &w, Some(1), Mode::Perplexity, |p| {
            seen.push((p.done, p.windows, p.nll.count))
        })
        .unwrap();
        let want = direct_mean_nll(&model, &t, &w);
        assert!(
            (eval.nll.mean() - want).abs() < 1e-9,
            "{w:?}: {} vs {want}",
            eval.nll.mean()
        );
        let ppl = eval.nll.ppl();
        assert!(ppl > 1.0 && ppl.is_finite(), "{ppl}");
        assert!(eval.nll.ppl_uncertainty() > 0.0);
        let progress: Vec<_> = (1..=w.count)
            .map(|i| (i, w.count, i * w.scored()))
            .collect();
        assert_eq!(seen, progress);
    }
}

#[test]
fn text_is_tokenized_with_bos_first() {
    let file = model_file("t2");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&file.path).unwrap()).unwrap();
    let (t, bos) = perplexity::tokenize(&tok, "a b c ab").unwrap();
    assert_eq!(bos, Some(1));
    assert_eq!(t[0], 1);
    assert_eq!(&t[1..], tok.encode("a b c ab", false).unwrap());
}

#[test]
fn a_run_against_its_own_saved_logits_has_no_divergence() {
    let file = model_file("t3");
    let t = tokens(200, 2);
    let w = Windows::chunks(t.len(), CTX, None).unwrap();
    for dev in tiny_llama::devices() {
        let model = load(&file, &dev, DType::F32);
        let path = tmp(&format!("self-{}.logits", dev.name().replace(' ', "_")));
        let saved = save(&model, &t, &w, &path);
        let size = std::fs::metadata(&path).unwrap().len();
        let mut reader = LogitsReader::open(&path).unwrap();
        assert_eq!(size, reader.header().file_bytes());
        assert_eq!(reader.header().windows, w);
        assert_eq!(reader.header().description, "tiny test model");
        let eval = run(&model, &t, &w, Mode::Compare(&mut reader)).unwrap();
        let kl = eval.kl.as_ref().unwrap();
        let s = kl.summary();
        assert_eq!(s.count, w.positions());
        assert!(s.kld.0 < 1e-6, "{dev}: mean KL {}", s.kld.0);
        assert!(
            s.kld_spread.max < 1e-5,
            "{dev}: max KL {}",
            s.kld_spread.max
        );
        assert!(s.kld_spread.min >= 0.0);
        assert_eq!(s.same_top.0, 1.0, "{dev}: top-1 agreement");
        assert!(s.ln_ppl_ratio.0.abs() < 1e-6, "{dev}: {:?}", s.ln_ppl_ratio);
        assert!(s.p_diff_spread.max.abs() < 1e-5 && s.p_diff_spread.min.abs() < 1e-5);
        assert!((s.ppl.0 - saved.nll.ppl()).abs() < 1e-6 * s.ppl.0);
        assert!((s.ppl_base.0 - s.ppl.0).abs() < 1e-4 * s.ppl.0);
        let report = s.report();
        for line in [
            "====== Perplexity statistics ======",
            "Mean ln(PPL(Q)/PPL(base))     :",
            "====== KL divergence statistics ======",
            "Median  KLD:",
            "99.0%   KLD:",
            "====== Token probability statistics ======",
            "Mean    Δp:",
            "Same top p: 100.000 ± 0.000 %",
        ] {
            assert!(report.contains(line), "no {line:?} in\n{report}");
        }
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn another_path_diverges_from_the_saved_one() {
    let file = model_file("t4");
    let t = tokens(200, 3);
    let w = Windows::chunks(t.len(), CTX, None).unwrap();
    let path = tmp("bf16.logits");
    save(&load(&file, &Device::cpu(), DType::F32), &t, &w, &path);
    let bf16 = load(&file, &Device::cpu(), DType::BF16);
    let mut reader = LogitsReader::open(&path).unwrap();
    let eval = run(&bf16, &t, &w, Mode::Compare(&mut reader)).unwrap();
    let s = eval.kl.unwrap().summary();
    assert!(s.kld.0 > 1e-7 && s.kld.0.is_finite(), "{:?}", s.kld);
    assert!(s.kld_spread.max > s.kld_spread.min);
    assert!(s.p_diff_rms.0 > 0.0);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_file_saved_from_other_tokens_is_refused() {
    let file = model_file("t5");
    let model = load(&file, &Device::cpu(), DType::F32);
    let t = tokens(100, 4);
    let w = Windows::chunks(t.len(), CTX, None).unwrap();
    let path = tmp("other.logits");
    save(&model, &t, &w, &path);
    let mut other = t.clone();
    other[40] = if other[40] == 300 { 301 } else { 300 };
    let mut reader = LogitsReader::open(&path).unwrap();
    let err = run(&model, &other, &w, Mode::Compare(&mut reader))
        .expect_err("other tokens are refused")
        .to_string();
    assert!(err.contains("another text or tokenizer"), "{err}");
    assert!(err.contains("other.logits"), "{err}");
    // a longer text with the same beginning too
    let mut longer = t.clone();
    longer.push(300);
    let reader = LogitsReader::open(&path).unwrap();
    assert!(reader.check_tokens(&longer).is_err());
    assert!(reader.check_tokens(&t).is_ok());
    assert!(reader.check_vocab(511).is_err());
    // windows other than the saved ones
    let mut reader = LogitsReader::open(&path).unwrap();
    let strided = Windows::strided(t.len(), CTX, 8, None).unwrap();
    let err = run(&model, &t, &strided, Mode::Compare(&mut reader))
        .expect_err("other windows are refused")
        .to_string();
    assert!(err.contains("saved with windows of 32 tokens"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// The error of opening (and reading through) a file holding `bytes`.
fn open_error(name: &str, bytes: &[u8]) -> String {
    let path = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    let result = LogitsReader::open(&path).and_then(|mut r| {
        let mut row = BaseRow::default();
        for _ in 0..r.header().windows.positions() {
            r.read_row(&mut row)?;
        }
        Ok(())
    });
    let _ = std::fs::remove_file(&path);
    let err = result.expect_err("the file is refused");
    assert!(
        matches!(err, Error::Format { .. } | Error::Io { .. }),
        "{err:?}"
    );
    err.to_string()
}

#[test]
fn truncated_foreign_and_corrupt_files_are_errors() {
    let file = model_file("t6");
    let model = load(&file, &Device::cpu(), DType::F32);
    let t = tokens(100, 5);
    let w = Windows::chunks(t.len(), CTX, None).unwrap();
    let path = tmp("good.logits");
    save(&model, &t, &w, &path);
    let good = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let header = 80 + "tiny test model".len();
    let record = 12 + 2 * model.config.vocab_size;
    assert_eq!(good.len(), header + w.positions() * record);

    for (cut, what) in [
        (good.len() - 1, "truncated"),
        (good.len() - record, "truncated"),
        (header + 3, "truncated"),
        (header - 2, "truncated"),
        (40, "truncated"),
        (4, "not a logits file"),
        (0, "not a logits file"),
    ] {
        let err = open_error("cut.logits", &good[..cut]);
        assert!(err.contains(what), "cut at {cut}: {err}");
    }
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 7]);
    let err = open_error("long.logits", &longer);
    assert!(err.contains("7 bytes after the last record"), "{err}");

    let mut llama_cpp = b"_logits_".to_vec();
    llama_cpp.extend_from_slice(&[0; 100]);
    assert!(open_error("llama.logits", &llama_cpp).contains("llama.cpp"));
    assert!(open_error("text.logits", b"Once upon a time").contains("not a logits file"));

    let patched = |offset: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[offset..offset + bytes.len()].copy_from_slice(bytes);
        b
    };
    let err = open_error("version.logits", &patched(8, &2u32.to_le_bytes()));
    assert!(err.contains("version 2"), "{err}");
    let err = open_error("windows.logits", &patched(28, &1000u32.to_le_bytes()));
    assert!(err.contains("inconsistent windows"), "{err}");
    let err = open_error("huge.logits", &patched(28, &u32::MAX.to_le_bytes()));
    assert!(err.contains("inconsistent windows"), "{err}");
    let err = open_error("vocab.logits", &patched(12, &u32::MAX.to_le_bytes()));
    assert!(err.contains("truncated"), "{err}");
    let err = open_error("span.logits", &patched(72, &f32::NAN.to_le_bytes()));
    assert!(err.contains("span"), "{err}");
    let err = open_error("desc.logits", &patched(76, &u32::MAX.to_le_bytes()));
    assert!(err.contains("description"), "{err}");
    // a record whose most likely token is outside the vocabulary
    let err = open_error("top.logits", &patched(header, &u32::MAX.to_le_bytes()));
    assert!(err.contains("outside the vocabulary"), "{err}");
    let err = open_error("lp.logits", &patched(header + 4, &f32::NAN.to_le_bytes()));
    assert!(err.contains("log-probabilities"), "{err}");
}

#[test]
fn an_unfinished_file_is_removed_and_a_short_one_is_not_named() {
    let file = model_file("t7");
    let model = load(&file, &Device::cpu(), DType::F32);
    let t = tokens(100, 6);
    let w = Windows::chunks(t.len(), CTX, None).unwrap();
    let path = tmp("unfinished.logits");
    let partial = tmp("unfinished.logits.partial");
    let header = LogitsHeader::new(&t, w, model.config.vocab_size, "");
    let mut writer = LogitsWriter::create(&path, header.clone()).unwrap();
    assert!(partial.exists());
    drop(writer);
    assert!(!partial.exists() && !path.exists());
    writer = LogitsWriter::create(&path, header).unwrap();
    let err = writer.finish().expect_err("records are missing");
    assert!(err.to_string().contains("0 of"), "{err}");
    assert!(!path.exists());
}

#[test]
fn llama_cpp_files_are_written_and_read() {
    let file = model_file("t8");
    let model = load(&file, &Device::cpu(), DType::F32);
    let t = tokens(110, 7);
    let w = Windows::chunks(t.len(), CTX, None).unwrap();
    let vocab = model.config.vocab_size;
    let path = tmp("llama.cpp.logits");
    let header = LogitsHeader::llama_cpp(&t, w, vocab).unwrap();
    let mut writer = LogitsWriter::create(&path, header).unwrap();
    let saved = run(&model, &t, &w, Mode::Save(&mut writer)).unwrap();
    writer.finish().unwrap();

    // llama.cpp's layout: magic, n_ctx, n_vocab, n_chunk, the windows'
    // token ids, then per position 2 floats and the codes padded to even
    let bytes = std::fs::read(&path).unwrap();
    let used = w.count * CTX;
    let record = 2 * (2 * vocab.div_ceil(2) + 4);
    assert_eq!(bytes.len(), 20 + 4 * used + w.positions() * record);
    assert_eq!(&bytes[..8], b"_logits_");
    let int = |o: usize| i32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    assert_eq!(
        (int(8), int(12), int(16)),
        (CTX as i32, vocab as i32, w.count as i32)
    );
    let stored: Vec<u32> = (0..used).map(|i| int(20 + 4 * i) as u32).collect();
    assert_eq!(stored, t[..used]);

    // compared with itself as llama.cpp compares
    let mut reader = LogitsReader::open(&path).unwrap();
    assert_eq!(reader.header().windows, w);
    let eval = run(&model, &t, &w, Mode::Compare(&mut reader)).unwrap();
    let s = eval.kl.unwrap().summary();
    assert!(s.kld.0.abs() < 1e-4, "{:?}", s.kld);
    assert!(s.kld_spread.max.abs() < 1e-3 && s.kld_spread.min.abs() < 1e-3);
    assert!(s.same_top.0 >= 0.98, "{:?}", s.same_top);
    assert!((s.ppl.0 - saved.nll.ppl()).abs() < 1e-9 * s.ppl.0);
    // llama.cpp's base probability of the next token is its code's, which
    // for a token more than 16 nats below the top (frequent with this
    // random model) is that floor: the base perplexity comes out lower
    assert!(
        s.ppl_base.0 <= s.ppl.0 * 1.001,
        "{:?} {:?}",
        s.ppl_base,
        s.ppl
    );

    // a text whose first windows differ is refused; one that goes on is not
    let mut other = t.clone();
    other[5] = if other[5] == 300 { 301 } else { 300 };
    let reader = LogitsReader::open(&path).unwrap();
    let err = reader.check_tokens(&other).unwrap_err().to_string();
    assert!(
        err.contains("another text or tokenizer") && err.contains("at token 5"),
        "{err}"
    );
    let mut longer = t.clone();
    longer.extend([300, 301]);
    assert!(reader.check_tokens(&longer).is_ok());
    assert!(reader.check_tokens(&t[..used - 1]).is_err());

    // llama.cpp's files hold its own windows only
    let strided = Windows::strided(t.len(), CTX, 8, None).unwrap();
    assert!(LogitsHeader::llama_cpp(&t, strided, vocab).is_err());

    // truncated and corrupt
    for cut in [bytes.len() - 1, 20 + 4 * used + 3, 30, 12] {
        let err = open_error("llama-cut.logits", &bytes[..cut]);
        assert!(err.contains("truncated"), "cut at {cut}: {err}");
    }
    let patched = |offset: usize, v: i32| {
        let mut b = bytes.clone();
        b[offset..offset + 4].copy_from_slice(&v.to_le_bytes());
        b
    };
    assert!(open_error("llama-vocab.logits", &patched(12, -1)).contains("vocabulary"));
    assert!(open_error("llama-chunks.logits", &patched(16, 0)).contains("windows"));
    assert!(open_error("llama-token.logits", &patched(24, -5)).contains("token id -5"));
    let err = open_error("llama-scale.logits", &{
        let mut b = bytes.clone();
        let o = 20 + 4 * used;
        b[o..o + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        b
    });
    assert!(err.contains("scale"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// Scoring each position as a decode step gives the prompt pass's
/// distributions: the same products on the CPU, within the decode
/// products' 8-bit rounding on a GPU.
#[test]
fn decode_steps_score_as_the_prompt_does() {
    let file = model_file("decode");
    let t = tokens(100, 9);
    let w = Windows::chunks(t.len(), CTX, Some(2)).unwrap();
    let cpu = load(&file, &Device::cpu(), DType::F32);
    let path = tmp("decode.base");
    let base = save(&cpu, &t, &w, &path);
    let by_steps = |model: &Llama| {
        let mut r = LogitsReader::open(&path).unwrap();
        perplexity::evaluate_by(
            model,
            &t,
            &w,
            Some(1),
            perplexity::Pass::Decode,
            Mode::Compare(&mut r),
            |_| {},
        )
        .unwrap()
    };
    let e = by_steps(&cpu);
    assert_eq!(e.nll.count, base.nll.count);
    let kl = e.kl.unwrap().summary();
    assert!(kl.kld.0 < 1e-6, "CPU: {kl:?}");
    assert_eq!(kl.same_top.0, 1.0, "{kl:?}");
    for i in 0..silica::adapters().len() {
        let gpu = load(&file, &Device::gpu(i).unwrap(), DType::F32);
        let e = by_steps(&gpu);
        let kl = e.kl.unwrap().summary();
        assert!(kl.kld.0 < 1e-2, "gpu:{i}: {kl:?}");
        assert!((e.nll.mean() - base.nll.mean()).abs() < 0.05, "gpu:{i}");
    }
}
