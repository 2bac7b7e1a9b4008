//! `silica perplexity`, run as the built binary on a tiny random-weight
//! model (tests/common/tiny_llama.rs of silica-models) and a short text with
//! small windows: the running and final perplexity lines, saving logits
//! and comparing a run with them (KL divergence about 0, top-1 agreement
//! 100%), and the errors for a file saved from another text, a truncated
//! file and a text shorter than one window.

#[path = "../../silica-models/tests/common/tiny_llama.rs"]
mod tiny_llama;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use tiny_llama::{Tiny, letters};

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("perplexity_{name}"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// The tiny quantized model (a context of 1,280 positions, 512 tokens).
fn model() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = tmp("tiny.gguf");
        Tiny::quantized().write_quantized(&path);
        path
    })
}

/// A text of `words` words of the tiny vocabulary, written to `name`.
fn text(name: &str, words: usize, seed: usize) -> PathBuf {
    let text: Vec<String> = (0..words)
        .map(|i| letters((i * 7 + seed * 13 + i * i) % 120))
        .collect();
    let path = tmp(name);
    std::fs::write(&path, text.join(" ") + "\n").unwrap();
    path
}

fn silica(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(args)
        .env_remove("SILICA_DEVICE")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the silica binary runs")
}

/// `silica perplexity FILE --model tiny --device cpu --ctx 32 EXTRA...`
fn perplexity(file: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "perplexity",
        s(file),
        "--model",
        s(model()),
        "--device",
        "cpu",
    ];
    if !extra.contains(&"--kl-base") {
        args.extend(["--ctx", "32"]);
    }
    args.extend(extra);
    silica(&args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value after `label` on the line that starts with it.
fn value(text: &str, label: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no line {label:?} in\n{text}"));
    line[label.len()..]
        .split_whitespace()
        .next()
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

/// Asserts a failure with status 2, nothing on stdout and an `error:` line
/// containing `want` as the last line of stderr.
fn check_failure(out: &Output, want: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "stdout: {}", stdout(out));
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{stderr}");
    assert!(last.contains(want), "{want:?} not in {last:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn perplexity_prints_running_and_final_estimates() {
    let file = text("plain.txt", 300, 1);
    let out = perplexity(&file, &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    // [1]x,[2]y,... one entry per window
    let running: Vec<&str> = lines[0].trim_end_matches(',').split(',').collect();
    assert!(running.len() >= 2, "{text}");
    for (i, entry) in running.iter().enumerate() {
        let (index, ppl) = entry[1..].split_once(']').expect("[i]ppl");
        assert_eq!(index.parse::<usize>().unwrap(), i + 1);
        assert!(ppl.parse::<f64>().unwrap() > 1.0, "{entry}");
    }
    assert!(lines[1].starts_with("Final estimate: PPL = "), "{text}");
    let ppl = value(lines[1], "Final estimate: PPL = ");
    let last: f64 = running
        .last()
        .unwrap()
        .split_once(']')
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!((ppl - last).abs() < 1e-3, "{ppl} {last}");
    assert!(lines[1].contains(" +/- "), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("windows of 32 tokens"), "{stderr}");

    // overlapping windows and a limit on their number
    let out = perplexity(&file, &["--stride", "8", "--chunks", "3"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.starts_with("[1]") && text.contains(",[3]") && !text.contains("[4]"),
        "{text}"
    );
    assert!(text.contains("Final estimate: PPL = "), "{text}");
}

#[test]
fn a_run_compared_with_its_own_saved_logits_agrees() {
    let file = text("kl.txt", 300, 2);
    let base = tmp("kl.logits");
    let saved = perplexity(&file, &["--save-logits", s(&base)]);
    assert!(saved.status.success(), "{saved:?}");
    assert!(base.exists());
    let plain = perplexity(&file, &[]);
    assert_eq!(
        stdout(&saved),
        stdout(&plain),
        "saving does not change the scores"
    );

    let out = perplexity(&file, &["--kl-base", s(&base)]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(text.starts_with("chunk "), "{text}");
    assert!(text.contains("KL Divergence"), "{text}");
    for line in [
        "====== Perplexity statistics ======",
        "====== KL divergence statistics ======",
        "====== Token probability statistics ======",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    assert!(value(&text, "Mean    KLD:").abs() < 1e-5, "{text}");
    assert!(value(&text, "Maximum KLD:").abs() < 1e-4, "{text}");
    assert!(value(&text, "99.0%   KLD:").abs() < 1e-4, "{text}");
    assert!(value(&text, "Median  KLD:").abs() < 1e-5, "{text}");
    assert!(
        value(&text, "Mean ln(PPL(Q)/PPL(base))     :").abs() < 1e-4,
        "{text}"
    );
    assert!(value(&text, "Mean    Δp:").abs() < 1e-2, "{text}");
    assert_eq!(value(&text, "Same top p:"), 100.0, "{text}");
    let ppl = value(&text, "Mean PPL(Q)                   :");
    let final_ppl = value(&stdout(&plain), "Final estimate: PPL = ");
    assert!((ppl - final_ppl).abs() < 1e-3 * ppl, "{ppl} {final_ppl}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("comparing with"), "{stderr}");
    assert!(stderr.contains("tiny test model"), "{stderr}");

    // --chunks compares the first windows only
    let out = perplexity(&file, &["--kl-base", s(&base), "--chunks", "1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(value(&stdout(&out), "Same top p:"), 100.0);

    // --decode: the same positions scored as decode steps agree with the prompt's
    let out = perplexity(&file, &["--kl-base", s(&base), "--decode", "--chunks", "2"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(value(&text, "Mean    KLD:").abs() < 1e-5, "{text}");
    assert_eq!(value(&text, "Same top p:"), 100.0, "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("decode steps"), "{stderr}");
}

#[test]
fn saved_logits_of_another_text_or_truncated_are_refused() {
    let file = text("refused.txt", 300, 3);
    let base = tmp("refused.logits");
    let saved = perplexity(&file, &["--save-logits", s(&base)]);
    assert!(saved.status.success(), "{saved:?}");

    let other = text("other.txt", 300, 4);
    let out = perplexity(&other, &["--kl-base", s(&base)]);
    check_failure(&out, "saved from another text or tokenizer");

    let bytes = std::fs::read(&base).unwrap();
    let cut = tmp("cut.logits");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let out = perplexity(&file, &["--kl-base", s(&cut)]);
    check_failure(&out, "truncated");

    let out = perplexity(&file, &["--kl-base", s(&file)]);
    check_failure(&out, "not a logits file");

    // --ctx and --stride come from the saved file
    let out = silica(&[
        "perplexity",
        s(&file),
        "--model",
        s(model()),
        "--kl-base",
        s(&base),
        "--ctx",
        "64",
    ]);
    check_failure(&out, "--ctx");
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let short = text("short.txt", 10, 5);
    check_failure(&perplexity(&short, &[]), "fewer than one window");
    let file = text("args.txt", 300, 6);
    check_failure(&perplexity(&file, &["--stride", "32"]), "--stride");
    let with_ctx = |ctx: &str| {
        silica(&[
            "perplexity",
            s(&file),
            "--model",
            s(model()),
            "--device",
            "cpu",
            "--ctx",
            ctx,
        ])
    };
    check_failure(&with_ctx("4096"), "exceeds the model's context of 1280");
    check_failure(&with_ctx("0"), "--ctx");
    check_failure(&with_ctx("2"), "at least 3");
    check_failure(&perplexity(&tmp("missing.txt"), &[]), "missing.txt");
    let empty = tmp("empty.txt");
    std::fs::write(&empty, "\n").unwrap();
    check_failure(&perplexity(&empty, &[]), "empty");
}

#[test]
fn logits_saved_in_llama_cpp_format_are_compared_too() {
    let file = text("llama.txt", 300, 7);
    let other = text("llama-other.txt", 300, 8);
    let base = tmp("llama.logits");
    let saved = perplexity(
        &file,
        &["--save-logits", s(&base), "--logits-format", "llama.cpp"],
    );
    assert!(saved.status.success(), "{saved:?}");
    assert_eq!(&std::fs::read(&base).unwrap()[..8], b"_logits_");

    let out = perplexity(&file, &["--kl-base", s(&base)]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(value(&text, "Mean    KLD:").abs() < 1e-4, "{text}");
    assert!(value(&text, "Same top p:") >= 98.0, "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a llama.cpp logits file"), "{stderr}");

    check_failure(
        &perplexity(&other, &["--kl-base", s(&base)]),
        "saved from another text or tokenizer",
    );
    check_failure(
        &perplexity(&file, &["--logits-format", "llama.cpp"]),
        "--save-logits",
    );
    check_failure(
        &perplexity(
            &file,
            &[
                "--stride",
                "8",
                "--save-logits",
                s(&tmp("llama-strided.logits")),
                "--logits-format",
                "llama.cpp",
            ],
        ),
        "--stride",
    );
}
