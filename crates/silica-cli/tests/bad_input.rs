//! Bad input on the command line, run as the built binary: every case ends
//! with exit status 2, nothing on stdout and exactly one line on stderr,
//! `error: ...`, naming what was wrong; never a panic or a backtrace
//! (`RUST_BACKTRACE=1` is set, so a panic would print one). And generation
//! that reaches the end of the model's context stops there and says so.
//!
//! The models here are tiny random-weight GGUF files written by the test
//! (a context of 64 positions), so no case needs a downloaded model.

#[path = "../../silica-models/tests/common/tiny_llama.rs"]
mod tiny_llama;

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use tiny_llama::Tiny;

/// The context of the tiny model.
const CONTEXT: usize = 64;

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bad_input_{name}"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// A private runtime folder: without one, Mesa's drivers print their own
/// `XDG_RUNTIME_DIR` complaint to stderr while wgpu lists the adapters.
fn runtime_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tmp("xdg_runtime");
        std::fs::create_dir_all(&dir).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        dir
    })
}

/// Runs `silica args` with `env` set and `stdin` on its standard input.
fn run(args: &[&OsStr], env: &[(&str, &str)], stdin: &[u8]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_silica"));
    cmd.args(args)
        .env_remove("SILICA_DEVICE")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .env("XDG_RUNTIME_DIR", runtime_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("the silica binary runs");
    // the program may exit before reading its input: a closed pipe is fine
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// Asserts that `out` is a failure as described above, whose error line
/// contains `want`; prints the line (for RELIABILITY.md) and returns it.
fn check_failure(what: &str, out: &Output, want: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "{what}: stdout {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(lines.len(), 1, "{what}: one line expected:\n{stderr}");
    let line = lines[0];
    assert!(line.starts_with("error: "), "{what}: {line}");
    assert!(line.len() > "error: ".len() + 10, "{what}: {line}");
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "internal error"] {
        assert!(!line.contains(bad), "{what}: {line}");
    }
    assert!(line.contains(want), "{what}: {want:?} not in {line:?}");
    eprintln!("| `{what}` | `{line}` | 2 |");
    line.to_string()
}

/// [`check_failure`] of `silica args`.
fn fails(args: &[&str], want: &str) -> String {
    let os: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let out = run(&os, &[], b"");
    check_failure(&format!("silica {}", args.join(" ")), &out, want)
}

/// A file named `name` in the temporary folder, holding `bytes`.
fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The tiny model (64 positions), written once.
fn tiny() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = tmp("tiny.gguf");
        Tiny::new(CONTEXT).write(&path);
        path
    })
}

/// The tiny model with `tokenizer.chat_template` set to `template`.
fn tiny_with_chat_template(name: &str, template: &str) -> PathBuf {
    use silica_models::gguf::{GgufFile, GgufWriter, MetaValue};
    let source = GgufFile::open(tiny()).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in source.metadata() {
        w.metadata(key.clone(), value.clone()).unwrap();
    }
    w.metadata(
        "tokenizer.chat_template",
        MetaValue::String(template.into()),
    )
    .unwrap();
    for t in source.tensors() {
        let data = source.tensor_bytes(t).to_vec();
        w.add_tensor(t.name.clone(), &t.shape(), t.ggml_type, data)
            .unwrap();
    }
    let path = tmp(name);
    w.write_to_path(&path).unwrap();
    path
}

#[test]
fn unknown_devices() {
    let m = s(tiny());
    fails(
        &["generate", "hi", "--model", m, "--device", "nosuch"],
        "no device matches \"nosuch\"",
    );
    fails(
        &["generate", "hi", "--model", m, "--device", "gpu:99"],
        "\"gpu:99\"",
    );
    fails(
        &["generate", "hi", "--model", m, "--device", "gpu:x"],
        "expected gpu:N with N a number",
    );
    fails(&["embed", "hi", "--device", ""], "empty device name");
    fails(&["bench", "--device", "nosuch"], "no device matches");
    fails(
        &["devices", "--ops", "--device", "nosuch"],
        "no device matches",
    );
    for args in [
        &["generate", "hi", "--model", m][..],
        &["embed", "hi"],
        &["devices", "--ops"],
    ] {
        let os: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let out = run(&os, &[("SILICA_DEVICE", "bogus")], b"");
        let what = format!("SILICA_DEVICE=bogus silica {}", args.join(" "));
        check_failure(
            &what,
            &out,
            "SILICA_DEVICE=bogus: no device matches \"bogus\"",
        );
    }
}

#[test]
fn missing_files() {
    fails(
        &[
            "generate",
            "hi",
            "--model",
            "/nonexistent.gguf",
            "--device",
            "cpu",
        ],
        "model /nonexistent.gguf: no such file or folder",
    );
    let empty_dir = tmp("empty_dir");
    std::fs::create_dir_all(&empty_dir).unwrap();
    fails(
        &[
            "generate",
            "hi",
            "--model",
            s(&empty_dir),
            "--device",
            "cpu",
        ],
        "the folder holds no .gguf file",
    );
    fails(
        &["generate", "--file", "/nonexistent.txt", "--device", "cpu"],
        "/nonexistent.txt: No such file",
    );
    fails(
        &[
            "embed",
            "hi",
            "--model",
            "/nonexistent-dir",
            "--device",
            "cpu",
        ],
        "model /nonexistent-dir: no such folder",
    );
    fails(
        &["embed", "hi", "--model", s(&empty_dir), "--device", "cpu"],
        "the folder lacks config.json, model.safetensors, tokenizer.json",
    );
    fails(
        &["embed", "--file", "/nonexistent.txt"],
        "/nonexistent.txt: No such file",
    );
    fails(
        &["quantize", "/nonexistent.gguf", s(&tmp("q_out.gguf"))],
        "/nonexistent.gguf: no such file",
    );
    fails(&["quantize"], "required arguments were not provided");
    assert!(!tmp("q_out.gguf").exists());
}

#[test]
fn files_that_are_not_models_silica_runs() {
    let gen_with = |model: &Path, want: &str| {
        fails(
            &["generate", "hi", "--model", s(model), "--device", "cpu"],
            want,
        )
    };
    let mamba = tmp("mamba.gguf");
    Tiny {
        architecture: "mamba",
        ..Tiny::new(CONTEXT)
    }
    .write(&mamba);
    gen_with(&mamba, "unsupported: architecture \"mamba\"");
    let gpt2 = tmp("gpt2.gguf");
    Tiny {
        architecture: "gpt2",
        ..Tiny::new(CONTEXT)
    }
    .write(&gpt2);
    gen_with(&gpt2, "unsupported: architecture \"gpt2\"");

    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    gen_with(&file("noise.gguf", &noise), "noise.gguf");
    gen_with(&file("empty.gguf", b""), "empty.gguf");
    let whole = std::fs::read(tiny()).unwrap();
    for cut in [4, 100, whole.len() / 2, whole.len() - 1] {
        let name = format!("cut_{cut}.gguf");
        gen_with(&file(&name, &whole[..cut]), &name);
    }
    // a model folder whose config is not JSON
    let dir = tmp("bad_encoder");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::write(dir.join(f), b"not json").unwrap();
    }
    fails(
        &["embed", "hi", "--model", s(&dir), "--device", "cpu"],
        "config.json",
    );
}

#[test]
fn prompts_longer_than_the_context() {
    let m = s(tiny());
    // "a" is one token, after the start token
    let words = vec!["a"; CONTEXT].join(" ");
    fails(
        &["generate", &words, "--model", m, "--device", "cpu"],
        "the prompt has 65 tokens; the model's context holds 64",
    );
    let long = file("long_prompt.txt", format!("{words}\n").as_bytes());
    fails(
        &[
            "generate",
            "--file",
            s(&long),
            "--model",
            m,
            "--device",
            "cpu",
        ],
        "the prompt has 65 tokens; the model's context holds 64",
    );
}

#[test]
fn invalid_utf8() {
    let bad = file("invalid_utf8.txt", b"first line\nbad \xff\xfe here\n");
    fails(
        &["embed", "--file", s(&bad)],
        "invalid_utf8.txt: line 2 is not valid UTF-8 (at byte 4 of the line)",
    );
    fails(
        &["generate", "--file", s(&bad), "--device", "cpu"],
        "invalid_utf8.txt: not valid UTF-8 (at byte 15)",
    );
    let out = run(
        &[OsStr::new("embed"), OsStr::new("--file"), OsStr::new("-")],
        &[],
        b"\xc3\x28\n",
    );
    check_failure(
        "silica embed --file - < invalid UTF-8",
        &out,
        "standard input: line 1 is not valid UTF-8",
    );
    let out = run(
        &[
            OsStr::new("generate"),
            OsStr::new("--file"),
            OsStr::new("-"),
        ],
        &[],
        b"caf\xe9\n",
    );
    check_failure(
        "silica generate --file - < invalid UTF-8",
        &out,
        "standard input: not valid UTF-8 (at byte 3)",
    );
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        let arg = OsString::from_vec(b"caf\xe9".to_vec());
        let out = run(&[OsStr::new("generate"), &arg], &[], b"");
        check_failure(
            "silica generate <invalid UTF-8 argument>",
            &out,
            "invalid UTF-8 was detected",
        );
    }
}

#[test]
fn empty_inputs() {
    let m = s(tiny());
    fails(&["generate", "", "--model", m], "the prompt is empty");
    fails(&["generate", " \n\t", "--model", m], "the prompt is empty");
    let empty = file("empty.txt", b"");
    let blank = file("blank.txt", b"\n  \n\r\n");
    fails(
        &["generate", "--file", s(&empty), "--model", m],
        "the prompt is empty",
    );
    for f in [&empty, &blank] {
        fails(&["embed", "--file", s(f)], "no sentences to embed");
    }
    fails(&["embed"], "no sentences to embed");
    fails(&["embed", "", "  "], "no sentences to embed");
    fails(&["generate"], "required arguments were not provided");
}

#[test]
fn bad_flag_values() {
    let g = |flag: &str, value: &str, want: &str| {
        fails(&["generate", "hi", flag, value], want);
    };
    g("--max-tokens", "-1", "expected a whole number, 0 or more");
    g("--max-tokens", "ten", "expected a whole number, 0 or more");
    g("--top-k", "-3", "expected a whole number, 0 or more");
    g("--temperature", "nan", "expected a finite number");
    g("--temperature", "inf", "expected a finite number");
    g("--temperature", "-0.5", "expected 0 (greedy) or more");
    g("--top-p", "2", "expected a number from 0 to 1");
    g("--min-p", "-1", "expected a number from 0 to 1");
    g("--repeat-penalty", "0", "expected a number above 0");
    g("--frequency-penalty", "3", "expected a number from -2 to 2");
    g(
        "--presence-penalty",
        "-2.5",
        "expected a number from -2 to 2",
    );
    g("--stop", "", "the stop text is empty");
    g("--dtype", "f64", "unknown dtype \"f64\" (f32, f16 or bf16)");
    g("--seed", "-1", "invalid value '-1' for '--seed <SEED>'");
    fails(
        &["embed", "hi", "--dtype", "f64"],
        "invalid value 'f64' for '--dtype <DTYPE>' [possible values: f32, f16]",
    );
    fails(
        &["embed", "hi", "--batch-size", "0"],
        "\"0\" is not a positive number",
    );
    fails(
        &["embed", "hi", "--output", s(&tmp("out.txt"))],
        "unknown output format",
    );
    fails(&["bench", "--dtype", "int8"], "unknown dtype \"int8\"");
    fails(
        &["bench", "--seconds", "0"],
        "expected a number of seconds above 0",
    );
    fails(
        &["quantize", "in.gguf", "out.gguf", "--type", "q3_k"],
        "unknown --type \"q3_k\"",
    );
    fails(&["generate", "hi", "--system", "x"], "--chat");
    fails(
        &[
            "generate",
            "hi",
            "--chat",
            "--model",
            s(tiny()),
            "--device",
            "cpu",
        ],
        "--chat: the model has no chat template",
    );
    fails(
        &["generate", "hi", "--frobnicate"],
        "unexpected argument '--frobnicate'",
    );
    fails(&["frobnicate"], "unrecognized subcommand 'frobnicate'");
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let m = s(tiny());
    let out = run(
        &[
            "generate",
            "a b c",
            "--model",
            m,
            "--device",
            "cpu",
            "--temperature",
            "0",
            "--max-tokens",
            "1000",
        ]
        .map(OsStr::new),
        &[],
        b"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("a b c"), "{stdout}");
    let last = stderr.lines().last().unwrap_or_default();
    // 4 prompt tokens (with the start token): 61 generated fill the
    // context, and the last of them is printed without being fed back
    assert!(last.contains("| 4 prompt tokens,"), "{stderr}");
    assert!(last.contains("| 61 tokens at "), "{stderr}");
    assert!(
        last.ends_with("stop: context full (64 tokens)]"),
        "{stderr}"
    );
    eprintln!("{last}");

    // the prompt from a file (its final line end dropped) and a stop at
    // max tokens
    let prompt = file("prompt.txt", b"a b c\n");
    let out = run(
        &[
            "generate",
            "--file",
            s(&prompt),
            "--model",
            m,
            "--device",
            "cpu",
            "--max-tokens",
            "5",
        ]
        .map(OsStr::new),
        &[],
        b"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("a b c"));
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("| 4 prompt tokens,"), "{stderr}");
    assert!(last.ends_with("stop: max tokens]"), "{stderr}");
}

#[test]
fn chat_uses_the_file_template() {
    // a template that refuses a system message, as Gemma 2's does
    let no_system = tiny_with_chat_template(
        "no_system.gguf",
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
         {{ bos_token }}{% for m in messages %}{{ m['content'] | trim }}{% endfor %}",
    );
    let m = s(&no_system);
    let chat = ["generate", "a b", "--chat", "--model", m, "--device", "cpu"];
    fails(
        &[&chat[..], &["--system", "Be brief."]].concat(),
        "--system: the model's chat template does not accept a system message: System role not supported",
    );
    // without --system it renders, and the status line names the template
    let args: Vec<&OsStr> = chat
        .iter()
        .chain(&["--max-tokens", "3"])
        .map(OsStr::new)
        .collect();
    let out = run(&args, &[], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    // one BOS (the template writes it and the tokenizer adds it), "a", "b"
    assert!(last.contains("| 3 prompt tokens,"), "{stderr}");
    assert!(
        last.ends_with("| template: gguf | stop: max tokens]"),
        "{stderr}"
    );
    // a template that does not parse
    let broken = tiny_with_chat_template("broken_template.gguf", "{% for m in messages %}");
    fails(
        &[
            "generate",
            "a",
            "--chat",
            "--model",
            s(&broken),
            "--device",
            "cpu",
        ],
        "unsupported: tokenizer.chat_template: syntax error: unexpected end of input",
    );
}

#[test]
fn a_closed_output_pipe_ends_generation_quietly() {
    // `silica generate ... | head -c 1`: the reader is gone before the
    // program writes (a panic "failed printing to stdout" before the fix)
    let mut child = Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(["generate", "a b c", "--model", s(tiny()), "--device", "cpu"])
        .args(["--max-tokens", "1000", "--temperature", "0"])
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}
