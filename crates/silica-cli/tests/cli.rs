//! Runs the built `silica` binary.

use std::process::{Command, Output};

fn silica(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(args)
        .env_remove("SILICA_DEVICE")
        .env_remove("RUST_LOG")
        .output()
        .expect("the silica binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn devices_lists_the_cpu_and_marks_a_default() {
    let out = silica(&["devices"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.lines().any(|l| l.contains(" cpu ")),
        "no cpu line:\n{stdout}"
    );
    assert!(
        stdout.contains("* default device: "),
        "no default:\n{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with('*')).count(),
        2,
        "exactly one device is marked:\n{stdout}"
    );
}

#[test]
fn ops_table_on_the_cpu_is_all_native() {
    let out = silica(&["devices", "--ops", "--device", "cpu"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("Ops on cpu"), "{stdout}");
    for op in ["matmul", "softmax", "add", "where", "index_select"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(op)),
            "no row for {op}:\n{stdout}"
        );
    }
    let matmul = stdout
        .lines()
        .find(|l| l.starts_with("matmul "))
        .expect("a matmul row");
    let cells: Vec<&str> = matmul.split_whitespace().skip(1).collect();
    assert_eq!(cells, ["native", "native", "native", "-", "-"], "{matmul}");
    assert!(stdout.contains(" 0 CPU fallback"), "{stdout}");
}

#[test]
fn unknown_device_is_a_one_line_error_with_status_2() {
    let out = silica(&["devices", "--ops", "--device", "nosuchdevice"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {out:?}");
    // Graphics drivers may write their own lines to stderr while wgpu
    // enumerates adapters (Mesa does without XDG_RUNTIME_DIR), so look for
    // silica's line rather than requiring stderr to hold nothing else.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("nosuchdevice"))
        .collect();
    assert_eq!(ours.len(), 1, "one error line expected:\n{stderr}");
    assert!(ours[0].starts_with("error: "), "{stderr}");
    assert_eq!(stderr.lines().last(), Some(ours[0]), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}

/// The silica binary with `args`, its cache folder `cache`, the pipeline
/// cache on, the default device, and `RUST_LOG` as given (unset by default).
fn run_with_cache(
    args: &[&str],
    cache: &std::path::Path,
    log: Option<&str>,
) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_silica"));
    cmd.args(args)
        .env("SILICA_CACHE", cache)
        .env_remove("SILICA_DEVICE")
        .env_remove("SILICA_NO_PIPELINE_CACHE");
    match log {
        Some(l) => cmd.env("RUST_LOG", l),
        None => cmd.env_remove("RUST_LOG"),
    };
    cmd.output().expect("the silica binary runs")
}

/// Whether a GPU run succeeded; a failure is only allowed where no GPU is
/// required (`SILICA_REQUIRE_GPU` is not 1).
fn gpu_ran(out: &std::process::Output) -> bool {
    if !out.status.success() {
        assert!(
            std::env::var("SILICA_REQUIRE_GPU").as_deref() != Ok("1"),
            "SILICA_REQUIRE_GPU=1 but the GPU run failed: {out:?}"
        );
    }
    out.status.success()
}

/// A GPU run leaves its compiled pipelines under the cache folder (Vulkan),
/// and the next run reads them; a corrupt file is a warning, never an
/// error, and is replaced by a valid one.
#[test]
fn pipeline_cache_is_saved_and_a_corrupt_one_is_ignored() {
    let dir = std::env::temp_dir().join(format!("silica-cli-pc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let args = [
        "bench",
        "--device",
        "gpu",
        "--filter",
        "softmax 1x4096",
        "--seconds",
        "0.01",
    ];
    let run = || run_with_cache(&args, &dir, None);
    let out = run();
    if !gpu_ran(&out) {
        return; // no GPU here
    }
    if !text(&out.stdout).contains(", vulkan)") {
        return; // only Vulkan keeps an application pipeline cache
    }
    let files: Vec<_> = std::fs::read_dir(dir.join("pipelines"))
        .expect("the pipeline folder exists")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let valid = std::fs::read(file).unwrap();
    assert!(valid.starts_with(b"SILICAPC"), "{valid:?}");

    // flip the last byte: the checksum no longer matches
    let mut corrupt = valid.clone();
    *corrupt.last_mut().unwrap() ^= 0x55;
    std::fs::write(file, &corrupt).unwrap();
    let out = run();
    assert!(out.status.success(), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("pipeline cache") && stderr.contains("corrupt"),
        "no warning:\n{stderr}"
    );
    let rewritten = std::fs::read(file).unwrap();
    assert!(rewritten.starts_with(b"SILICAPC") && rewritten != corrupt);

    // a file of another program
    std::fs::write(file, b"not a cache").unwrap();
    let out = run();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stderr).contains("not a silica pipeline cache"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPU `generate` lists the kernels it used beside the pipeline cache;
/// the next run of the same model queues them to build while it loads. A
/// list that is not silica's is a warning, and is written anew.
#[test]
fn generate_lists_its_kernels_and_the_next_run_builds_them_ahead() {
    let dir = std::env::temp_dir().join(format!("silica-cli-kl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(["quantize", "--synthetic", "tiny-llama3", "--type", "q8_0"])
        .arg(&model)
        .output()
        .expect("the silica binary runs");
    assert!(out.status.success(), "{out:?}");
    let model_arg = model.to_string_lossy().into_owned();
    let args = [
        "generate",
        "--device",
        "gpu",
        "--max-tokens",
        "3",
        "--temperature",
        "0",
        "--model",
        &model_arg,
        "hello there",
    ];
    let cache = dir.join("cache");
    let run = || run_with_cache(&args, &cache, Some("warn,silica::pipelines=debug"));
    let out = run();
    if !gpu_ran(&out) {
        return; // no GPU here
    }
    let stderr = text(&out.stderr);
    assert!(stderr.contains("kernels to build ahead"), "{stderr}");
    assert!(
        stderr.contains("kernels=0"),
        "nothing listed yet:\n{stderr}"
    );
    let lists: Vec<_> = std::fs::read_dir(dir.join("cache/pipelines"))
        .expect("the pipeline folder exists")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("kernels-")
        })
        .collect();
    assert_eq!(lists.len(), 1, "{lists:?}");
    let list = std::fs::read_to_string(&lists[0]).unwrap();
    let kernels = list.lines().count() - 2;
    assert!(kernels > 5, "{list}");
    assert!(list.lines().any(|l| l.starts_with("qgemv")), "{list}");

    // the second run queues every kernel of the list
    let out = run();
    assert!(out.status.success(), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("kernels={kernels}")),
        "{kernels} kernels expected:\n{stderr}"
    );

    // a file of another program
    std::fs::write(&lists[0], "not a list\n").unwrap();
    let out = run();
    assert!(out.status.success(), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not a silica kernel list"), "{stderr}");
    assert!(
        std::fs::read_to_string(&lists[0])
            .unwrap()
            .starts_with("silica kernels 1")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
