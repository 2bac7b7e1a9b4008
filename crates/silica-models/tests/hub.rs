//! Hugging Face ids resolved through downloads, against a small hub served
//! on 127.0.0.1 by the test itself (plain HTTP; no internet needed). The
//! mock answers the requests `hf-hub`'s blocking client makes:
//!
//! * `GET /api/models/{org}/{name}/revision/main`: the repo's commit
//!   (`sha`) and files (`siblings`);
//! * `GET /{org}/{name}/resolve/{commit}/{file}` with `Range: bytes=0-0`:
//!   the file's metadata (`x-repo-commit`, `etag` or `x-linked-etag`,
//!   `content-range`), then with `Range: bytes=0-` its bytes.
//!
//! Each test has its own server and cache folder and passes them through
//! [`HubOptions`], so the tests share no environment variables and run in
//! parallel. (A proxy set in the environment without `NO_PROXY=127.0.0.1`
//! would take the requests away from the mock.)

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use silica_models::resolve::{HubOptions, resolve_decoder_with, resolve_encoder_with, sha256_file};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A repo of the mock hub. `unserved` files are listed by the info call but
/// answer 404 when downloaded.
struct MockRepo {
    id: &'static str,
    files: Vec<(&'static str, Vec<u8>)>,
    unserved: Vec<&'static str>,
}

impl MockRepo {
    fn new(id: &'static str, files: &[(&'static str, &[u8])]) -> MockRepo {
        MockRepo {
            id,
            files: files.iter().map(|(n, b)| (*n, b.to_vec())).collect(),
            unserved: Vec::new(),
        }
    }
}

/// A hub on 127.0.0.1 that records the requests it gets ("PATH RANGE").
struct MockHub {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MockHub {
    fn start(repos: Vec<MockRepo>) -> MockHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        serve(stream, &repos, &requests);
                    }
                }
            })
        };
        MockHub {
            addr,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Stops the server: its port refuses connections afterwards.
    fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect(self.addr); // wakes the accept loop
            thread.join().unwrap();
        }
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Answers one request, then closes the connection.
fn serve(stream: TcpStream, repos: &[MockRepo], requests: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap() == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("range")
        {
            range = Some(value.trim().to_string());
        }
    }
    requests
        .lock()
        .unwrap()
        .push(format!("{path} {}", range.as_deref().unwrap_or("-")));
    let (status, headers, body) = route(&path, range.as_deref(), repos);
    let mut out = stream;
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(&body);
}

type Answer = (&'static str, Vec<(&'static str, String)>, Vec<u8>);

fn not_found(what: &str) -> Answer {
    let body = format!("{{\"error\":\"{what} not found\"}}").into_bytes();
    (
        "404 Not Found",
        vec![("Content-Type", "application/json".into())],
        body,
    )
}

/// The repo `rest` starts with, and what follows its id.
fn find_repo<'a, 'b>(repos: &'a [MockRepo], rest: &'b str) -> Option<(&'a MockRepo, &'b str)> {
    repos
        .iter()
        .find_map(|r| Some((r, rest.strip_prefix(r.id)?.strip_prefix('/')?)))
}

fn route(path: &str, range: Option<&str>, repos: &[MockRepo]) -> Answer {
    let find = |rest| find_repo(repos, rest);
    if let Some(rest) = path.strip_prefix("/api/models/") {
        return match find(rest) {
            Some((repo, "revision/main")) => {
                let siblings: Vec<String> = repo
                    .files
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(repo.unserved.iter().copied())
                    .map(|n| format!("{{\"rfilename\":\"{n}\"}}"))
                    .collect();
                let body = format!(
                    "{{\"id\":\"{}\",\"sha\":\"{COMMIT}\",\"siblings\":[{}]}}",
                    repo.id,
                    siblings.join(",")
                );
                (
                    "200 OK",
                    vec![("Content-Type", "application/json".into())],
                    body.into_bytes(),
                )
            }
            _ => not_found("Repository"),
        };
    }
    let Some((repo, rest)) = find(path.trim_start_matches('/')) else {
        return not_found("Repository");
    };
    let Some(file) = rest
        .strip_prefix("resolve/")
        .and_then(|r| r.strip_prefix(COMMIT).or_else(|| r.strip_prefix("main")))
        .and_then(|r| r.strip_prefix('/'))
    else {
        return not_found("Revision");
    };
    let Some((name, bytes)) = repo.files.iter().find(|(n, _)| *n == file) else {
        return not_found("Entry");
    };
    let digest: String = {
        use sha2::{Digest, Sha256};
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    // The hub names large (LFS) files by x-linked-etag, small ones by etag.
    let etag_header = if name.ends_with(".gguf") || name.ends_with(".safetensors") {
        "x-linked-etag"
    } else {
        "etag"
    };
    let total = bytes.len();
    let (start, end) = match range.and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b = if b.is_empty() {
                total - 1
            } else {
                b.parse().unwrap()
            };
            (a, b.min(total - 1))
        }
        None => (0, total - 1),
    };
    (
        "206 Partial Content",
        vec![
            ("x-repo-commit", COMMIT.into()),
            (etag_header, format!("\"{digest}\"")),
            ("Content-Range", format!("bytes {start}-{end}/{total}")),
        ],
        bytes[start..=end].to_vec(),
    )
}

/// A fresh, empty cache folder for one test.
fn temp_cache(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("silica-hub-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("hub")
}

fn options(endpoint: &str, cache_dir: &Path, offline: bool) -> HubOptions {
    HubOptions {
        endpoint: endpoint.to_string(),
        cache_dir: cache_dir.to_path_buf(),
        token: None,
        offline,
        progress: false,
    }
}

/// Bytes that stand for a model file (resolution never parses them).
fn fake_model(tag: u8, len: usize) -> Vec<u8> {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend((0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag));
    bytes
}

/// An address where nothing listens.
fn dead_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

fn err_text<T: std::fmt::Debug>(r: silica_models::Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn gguf_downloads_into_the_hub_cache_then_resolves_offline() {
    let model = fake_model(1, 100_000);
    let mut hub = MockHub::start(vec![MockRepo::new(
        "org/tiny-GGUF",
        &[("model.Q4_0.gguf", &model), ("README.md", b"# tiny")],
    )]);
    let cache = temp_cache("gguf");
    let online = options(&hub.endpoint(), &cache, false);

    let path = resolve_decoder_with(Some("org/tiny-GGUF"), &online).unwrap();
    let repo = cache.join("models--org--tiny-GGUF");
    assert_eq!(
        path,
        repo.join("snapshots").join(COMMIT).join("model.Q4_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert_eq!(
        std::fs::read_to_string(repo.join("refs").join("main")).unwrap(),
        COMMIT
    );
    // the snapshot entry links to the blob named by the file's etag
    let digest = sha256_file(&path).unwrap();
    assert_eq!(
        std::fs::canonicalize(&path).unwrap(),
        std::fs::canonicalize(repo.join("blobs").join(&digest)).unwrap()
    );
    let api = "/api/models/org/tiny-GGUF/revision/main -".to_string();
    let file = format!("/org/tiny-GGUF/resolve/{COMMIT}/model.Q4_0.gguf");
    assert_eq!(
        hub.requests(),
        [api, format!("{file} bytes=0-0"), format!("{file} bytes=0-")]
    );

    // From now on the cache answers, with the hub gone or downloads off.
    hub.stop();
    let dead = options(&dead_endpoint(), &cache, false);
    let offline = options(&dead_endpoint(), &cache, true);
    for opts in [&online, &dead, &offline] {
        assert_eq!(
            resolve_decoder_with(Some("org/tiny-GGUF"), opts).unwrap(),
            path
        );
        assert_eq!(
            resolve_decoder_with(Some("org/tiny-GGUF/model.Q4_0.gguf"), opts).unwrap(),
            path
        );
    }
    assert_eq!(hub.requests().len(), 3);
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

#[test]
fn several_gguf_files_need_a_name() {
    let (q4, q8, q2) = (
        fake_model(4, 5000),
        fake_model(8, 9000),
        fake_model(2, 3000),
    );
    let hub = MockHub::start(vec![MockRepo::new(
        "org/multi-GGUF",
        &[
            ("model-Q4_0.gguf", &q4),
            ("model-Q8_0.gguf", &q8),
            ("quants/model-Q2_K.gguf", &q2),
        ],
    )]);
    let cache = temp_cache("several");
    let online = options(&hub.endpoint(), &cache, false);

    let err = err_text(resolve_decoder_with(Some("org/multi-GGUF"), &online));
    assert!(
        err.contains("3 .gguf files")
            && err.contains("model-Q4_0.gguf, model-Q8_0.gguf, quants/model-Q2_K.gguf")
            && err.contains("name one, as in org/multi-GGUF/model-Q4_0.gguf"),
        "{err}"
    );
    assert_eq!(hub.requests().len(), 1, "only the file list was asked for");

    let snapshot = cache.join("models--org--multi-GGUF/snapshots").join(COMMIT);
    let q8_path = resolve_decoder_with(Some("org/multi-GGUF/model-Q8_0.gguf"), &online).unwrap();
    assert_eq!(q8_path, snapshot.join("model-Q8_0.gguf"));
    assert_eq!(std::fs::read(&q8_path).unwrap(), q8);
    let q2_path =
        resolve_decoder_with(Some("org/multi-GGUF/quants/model-Q2_K.gguf"), &online).unwrap();
    assert_eq!(q2_path, snapshot.join("quants").join("model-Q2_K.gguf"));
    assert_eq!(std::fs::read(&q2_path).unwrap(), q2);
    assert!(!snapshot.join("model-Q4_0.gguf").exists());

    // the cache now holds two of them: offline, the id alone still needs a name
    let offline = options(&hub.endpoint(), &cache, true);
    let before = hub.requests().len();
    let err = err_text(resolve_decoder_with(Some("org/multi-GGUF"), &offline));
    assert!(
        err.contains("model-Q8_0.gguf, quants/model-Q2_K.gguf") && err.contains("name one"),
        "{err}"
    );
    assert_eq!(hub.requests().len(), before);
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

#[test]
fn missing_repos_files_and_hubs_are_clear_errors() {
    let model = fake_model(3, 2000);
    let mut broken = MockRepo::new("org/broken-GGUF", &[]);
    broken.unserved.push("model.gguf");
    let hub = MockHub::start(vec![
        MockRepo::new("org/tiny-GGUF", &[("model.Q4_0.gguf", &model)]),
        MockRepo::new("org/safetensors-only", &[("model.safetensors", &model)]),
        broken,
    ]);
    let cache = temp_cache("errors");
    let online = options(&hub.endpoint(), &cache, false);

    let err = err_text(resolve_decoder_with(Some("org/absent"), &online));
    assert!(
        err.starts_with("model org/absent: ")
            && err.contains("not found")
            && err.contains("HTTP 404")
            && err.contains("HF_TOKEN"),
        "{err}"
    );
    let err = err_text(resolve_decoder_with(
        Some("org/tiny-GGUF/other.gguf"),
        &online,
    ));
    assert!(
        err.contains("no file other.gguf; its .gguf files: model.Q4_0.gguf"),
        "{err}"
    );
    let err = err_text(resolve_decoder_with(Some("org/safetensors-only"), &online));
    assert!(err.contains("holds no .gguf file"), "{err}");
    // listed by the hub, but 404 when downloaded
    let err = err_text(resolve_decoder_with(Some("org/broken-GGUF"), &online));
    assert!(
        err.contains("downloading model.gguf: model.gguf was not found") && err.contains("404"),
        "{err}"
    );
    let err = err_text(resolve_encoder_with(Some("org/absent"), &online));
    assert!(err.contains("HTTP 404"), "{err}");

    let dead = options(&dead_endpoint(), &cache, false);
    let err = err_text(resolve_decoder_with(Some("org/tiny-GGUF"), &dead));
    assert!(
        err.contains("could not reach") && err.contains("HF_HUB_OFFLINE=1"),
        "{err}"
    );
    let err = err_text(resolve_decoder_with(Some("not-an-id/x/y"), &online));
    assert!(err.contains("not a Hugging Face id"), "{err}");
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

#[test]
fn offline_and_not_cached_fails_without_requests() {
    let model = fake_model(5, 1000);
    let hub = MockHub::start(vec![MockRepo::new(
        "org/tiny-GGUF",
        &[("model.Q4_0.gguf", &model)],
    )]);
    let cache = temp_cache("offline");
    let offline = options(&hub.endpoint(), &cache, true);
    for err in [
        err_text(resolve_decoder_with(Some("org/tiny-GGUF"), &offline)),
        err_text(resolve_decoder_with(
            Some("org/tiny-GGUF/model.Q4_0.gguf"),
            &offline,
        )),
        err_text(resolve_encoder_with(Some("org/tiny-GGUF"), &offline)),
    ] {
        assert!(
            err.contains("not in the Hugging Face cache")
                && err.contains("downloads are off (HF_HUB_OFFLINE/SILICA_OFFLINE)"),
            "{err}"
        );
    }
    assert_eq!(hub.requests(), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}

#[test]
fn encoder_downloads_the_files_a_sentence_encoder_reads() {
    let weights = fake_model(6, 50_000);
    let modules =
        br#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
{"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
{"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;
    let files: [(&str, &[u8]); 8] = [
        ("config.json", b"{\"model_type\":\"bert\"}"),
        ("model.safetensors", &weights),
        ("tokenizer.json", b"{\"model\":{}}"),
        ("modules.json", modules),
        (
            "1_Pooling/config.json",
            b"{\"pooling_mode_mean_tokens\":true}",
        ),
        ("pytorch_model.bin", b"unused"),
        ("README.md", b"# mini"),
        ("tokenizer_config.json", b"{}"),
    ];
    let mut hub = MockHub::start(vec![
        MockRepo::new("org/mini-encoder", &files),
        MockRepo::new(
            "org/bin-only",
            &[("config.json", b"{}"), ("pytorch_model.bin", b"x")],
        ),
    ]);
    let cache = temp_cache("encoder");
    let online = options(&hub.endpoint(), &cache, false);

    let dir = resolve_encoder_with(Some("org/mini-encoder"), &online).unwrap();
    assert_eq!(
        dir,
        cache
            .join("models--org--mini-encoder/snapshots")
            .join(COMMIT)
    );
    for (name, bytes) in &files[..5] {
        assert_eq!(&std::fs::read(dir.join(name)).unwrap(), bytes, "{name}");
    }
    for name in ["pytorch_model.bin", "README.md", "tokenizer_config.json"] {
        assert!(!dir.join(name).exists(), "{name} was not needed");
    }

    let err = err_text(resolve_encoder_with(Some("org/bin-only"), &online));
    assert!(
        err.contains("the repo lacks model.safetensors, tokenizer.json"),
        "{err}"
    );

    hub.stop();
    let offline = options(&dead_endpoint(), &cache, true);
    assert_eq!(
        resolve_encoder_with(Some("org/mini-encoder"), &offline).unwrap(),
        dir
    );
    let _ = std::fs::remove_dir_all(cache.parent().unwrap());
}
